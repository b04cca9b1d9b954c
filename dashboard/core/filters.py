"""A subscription's payload filter: which of the events of its types it wants, judged on the thin body.

    {"data.region": "eu", "data.amount": {"$gte": 100}, "$or": [{"type": "invoice.paid"}, {"version": 2}]}

The language (documented for users in docs/api.md, "Filters"):
- A filter is a JSON object; its members must all hold (AND). A member is a path with its test, or a
  logical operator: `$and` / `$or` (a non-empty list of filters), `$not` (one filter).
- A path is dotted, into the thin body: `id`, `type`, `version`, `timestamp` or `data`, then keys inside
  `data` (`data.customer.region`); a segment of digits indexes an array (`data.items.0`).
- A test is a bare value (`"eu"`, `2`, `true`, `null`, `[1, 2]`: `$eq` that value), or an object of one or
  more operators, all of which must hold: `$eq $ne $in $nin $gt $gte $lt $lte $exists`.
- Equality is JSON's: same type and same value (numbers by value, so 1 equals 1.0; true is not 1; arrays
  and objects member by member). `$gt $gte $lt $lte` take a number or a string and hold only for a value of
  the same kind (strings by code point, so RFC 3339 times in the same form compare as times).
- A missing path fails every positive test (`$eq $in $gt $gte $lt $lte`, `$exists: true`); the negations
  (`$ne $nin`, `$exists: false`, and `$not` of a test that fails) hold. `null` is a value, not a missing path.
- At most MAX_CONDITIONS tests (each operator on a path counts one) and MAX_DEPTH levels (the filter is
  level 1; each `$and`, `$or` or `$not` puts its filters a level deeper); no regular expressions.

`compile` checks a filter and turns it into a predicate on the body (a tree of closures, built once);
a filter that is wrong is an ApiError(422) that names where, as a path into it ("filter.$and[1].data.amount:
$gt needs a number or a string"). `compiled_json` keeps the predicates of stored filters by their text, so
routing compiles each filter once, not once per event.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from typing import Any, Callable

from dashboard.core.validation import MAX_DATA_DEPTH, ApiError, nesting_depth, refuse_nul

log = logging.getLogger(__name__)

MAX_CONDITIONS = 32
MAX_DEPTH = 4
MAX_FILTER_BYTES = 8192  # as compact JSON, as an event's data
MAX_PATH_SEGMENTS = MAX_DATA_DEPTH + 1  # `data` and at most as many levels as data may have
ROOTS = ("id", "type", "version", "timestamp", "data")  # the thin body's members
COMPARISONS = ("$eq", "$ne", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "$exists")
LOGICAL = ("$and", "$or", "$not")

Predicate = Callable[[dict], bool]
_MISSING = object()


def compile(spec: Any, where: str = "filter") -> Predicate | None:  # noqa: A001 - the name the design uses
    """The predicate of filter `spec` (None: an empty filter, which every event passes). 422 naming where it is
    wrong, `where` being the name of the filter itself."""
    if not isinstance(spec, dict):
        raise ApiError(422, f"{where}: a filter is a JSON object, like {{\"data.region\": \"eu\"}}")
    try:
        text = json.dumps(spec, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise ApiError(422, f"{where}: numbers must be finite (JSON has no NaN or Infinity)") from None
    if "\\u0000" in text:  # how json.dumps writes NUL: only then is the filter walked for where it is
        refuse_nul(spec, where)
    size = len(text.encode("utf-8"))
    if size > MAX_FILTER_BYTES:
        raise ApiError(422, f"{where}: the filter is {size} bytes as compact JSON; at most {MAX_FILTER_BYTES}")
    builder = _Builder()
    predicate = builder.filter(spec, where, 1)
    return None if predicate is _always else predicate


def matches(spec: Any, event: dict, where: str = "filter") -> bool:
    """Does `event` (a thin body) pass filter `spec`? (POST /filters/test.)"""
    predicate = compile(spec, where)
    return predicate is None or predicate(event)


def checked(spec: Any, where: str = "filter") -> dict | None:
    """A filter as a subscription stores it: None for none, else `spec` once it compiles (422 if not)."""
    if spec is None:
        return None
    compile(spec, where)
    return spec


@functools.lru_cache(maxsize=1024)
def compiled_json(text: str) -> Predicate | None:
    """The predicate of a stored filter, given as its JSON text (routing reads it so), kept by that text: one
    compilation per filter and process, however many events and requests. None: no filter (SQL or JSON null,
    or an empty one). A stored filter that no longer compiles (a limit lowered since) lets every event through,
    and is logged: dropping events the subscription was created to receive would break the delivery promise."""
    spec = json.loads(text)
    if spec is None:
        return None
    try:
        return compile(spec)
    except ApiError as exc:
        log.warning("a stored payload filter no longer compiles (%s); it lets every event through", exc.message)
        return None


def stored(text: str | None) -> Predicate | None:
    """`compiled_json` for a column that may be SQL NULL."""
    return None if text is None else compiled_json(text)


def _always(_doc) -> bool:
    return True


class _Builder:
    """One compilation: counts the conditions as it goes."""

    def __init__(self):
        self.conditions = 0

    def filter(self, spec: Any, where: str, depth: int) -> Predicate:
        if not isinstance(spec, dict):
            raise ApiError(422, f"{where}: a filter is a JSON object, like {{\"data.region\": \"eu\"}}")
        if depth > MAX_DEPTH:
            raise ApiError(422, f"{where}: filters nest at most {MAX_DEPTH} levels deep ($and, $or and $not each "
                                "go one level deeper)")
        parts = []
        for key, value in spec.items():
            if key.startswith("$"):
                parts.append(self.logical(key, value, where, depth))
            else:
                parts.append(self.path_test(key, value, where))
        return _all_of(parts)

    def logical(self, key: str, value: Any, where: str, depth: int) -> Predicate:
        here = f"{where}.{key}"
        if key == "$not":
            inner = self.filter(value, here, depth + 1)
            return lambda doc: not inner(doc)
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                raise ApiError(422, f"{here}: {key} needs a non-empty list of filters")
            members = [self.filter(member, f"{here}[{i}]", depth + 1) for i, member in enumerate(value)]
            return _all_of(members) if key == "$and" else _any_of(members)
        if key in COMPARISONS:
            raise ApiError(422, f"{where}: {key} tests a path: write {{\"data.field\": {{\"{key}\": ...}}}}")
        raise ApiError(422, f"{where}: unknown operator {key!r}; logical operators are {', '.join(LOGICAL)}")

    def path_test(self, key: str, value: Any, where: str) -> Predicate:
        get = _getter(key, where)
        here = f"{where}.{key}"
        if not isinstance(value, dict):  # a bare value: equality
            return self.comparison("$eq", value, get, here)
        if not value:
            raise ApiError(422, f"{here}: an empty object tests nothing; give a value, or operators such as "
                                "{\"$eq\": ...} (an object value is compared with $eq)")
        tests = []
        for op, operand in value.items():
            if not op.startswith("$"):
                raise ApiError(422, f"{here}: {op!r} is not an operator; to compare with an object, use "
                                    "{\"$eq\": {...}}")
            tests.append(self.comparison(op, operand, get, here))
        return _all_of(tests)

    def comparison(self, op: str, operand: Any, get: Callable[[dict], Any], where: str) -> Predicate:
        self.conditions += 1
        if self.conditions > MAX_CONDITIONS:
            raise ApiError(422, f"{where}: a filter has at most {MAX_CONDITIONS} conditions (each operator on a "
                                "path counts one)")
        if op in ("$eq", "$ne"):
            equal = _equality(operand, op, where)
            if op == "$eq":
                return lambda doc: equal(get(doc))
            return lambda doc: not equal(get(doc))
        if op in ("$in", "$nin"):
            if not isinstance(operand, list):
                raise ApiError(422, f"{where}: {op} needs a list of values")
            contains = _membership([_literal(v, op, f"{where}[{i}]") for i, v in enumerate(operand)])
            if op == "$in":
                return lambda doc: contains(get(doc))
            return lambda doc: not contains(get(doc))
        if op in ("$gt", "$gte", "$lt", "$lte"):
            return _ordering(op, operand, get, where)
        if op == "$exists":
            if not isinstance(operand, bool):
                raise ApiError(422, f"{where}: $exists needs true or false")
            if operand:
                return lambda doc: get(doc) is not _MISSING
            return lambda doc: get(doc) is _MISSING
        if op in LOGICAL:
            raise ApiError(422, f"{where}: {op} combines filters, not tests of one path: write "
                                f"{{\"{op}\": ...}} beside the paths")
        if op in ("$regex", "$where", "$expr"):
            raise ApiError(422, f"{where}: {op} is not supported: filters have no regular expressions or code")
        raise ApiError(422, f"{where}: unknown operator {op!r}; operators are {' '.join(COMPARISONS)}")


def _getter(path: str, where: str) -> Callable[[dict], Any]:
    """The value at a dotted path of the body, or _MISSING."""
    segments = path.split(".")
    if "" in segments:
        raise ApiError(422, f"{where}.{path}: a path is dotted keys, like data.region (no empty segment)")
    if segments[0] not in ROOTS:
        raise ApiError(422, f"{where}.{path}: paths start at the event's body: {', '.join(ROOTS)} "
                            f"(like data.{path})")
    if len(segments) > MAX_PATH_SEGMENTS:
        raise ApiError(422, f"{where}.{path}: a path has at most {MAX_PATH_SEGMENTS} segments")
    steps = tuple((s, int(s) if s.isdecimal() and s.isascii() and (s == "0" or s[0] != "0") else None)
                  for s in segments)
    if len(steps) == 1:
        key = steps[0][0]
        return lambda doc: doc.get(key, _MISSING)
    if len(steps) == 2 and steps[1][1] is None:
        first, second = steps[0][0], steps[1][0]

        def get_two(doc):
            node = doc.get(first, _MISSING)
            return node.get(second, _MISSING) if type(node) is dict else _MISSING
        return get_two

    def get(doc):
        node = doc
        for key, index in steps:
            if type(node) is dict:
                node = node.get(key, _MISSING)
            elif type(node) is list and index is not None and index < len(node):
                node = node[index]
            else:
                return _MISSING
        return node
    return get


# -- equality: JSON's, by a canonical key (bool apart from numbers, 1 == 1.0) ---------------------------------

def _key(value: Any) -> Any:
    kind = type(value)
    if kind is str:
        return ("s", value)
    if kind is bool:
        return ("b", value)
    if kind is int or kind is float:
        return ("n", value)
    if value is None:
        return ("z",)
    if kind is list:
        return ("a", tuple(_key(v) for v in value))
    if kind is dict:
        return ("o", frozenset((k, _key(v)) for k, v in value.items()))
    return ("?", id(value))  # nothing JSON makes: equal to nothing a filter names


def _literal(value: Any, op: str, where: str) -> Any:
    """A value a filter compares with, checked: finite numbers, nesting within data's limit."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ApiError(422, f"{where}: {op} needs a finite number")
    if isinstance(value, (dict, list)) and nesting_depth(value) > MAX_DATA_DEPTH:
        raise ApiError(422, f"{where}: {op}'s value is nested more than {MAX_DATA_DEPTH} levels deep")
    return value


def _equality(operand: Any, op: str, where: str) -> Callable[[Any], bool]:
    operand = _literal(operand, op, where)
    kind = type(operand)
    if kind is str:
        return lambda v: type(v) is str and v == operand
    if kind is bool:
        return lambda v: type(v) is bool and v == operand
    if kind is int or kind is float:
        return lambda v: (type(v) is int or type(v) is float) and v == operand
    if operand is None:
        return lambda v: v is None
    key = _key(operand)
    container = list if kind is list else dict
    return lambda v: type(v) is container and _key(v) == key


def _membership(values: list) -> Callable[[Any], bool]:
    keys = frozenset(_key(v) for v in values)
    return lambda v: v is not _MISSING and _key(v) in keys


def _ordering(op: str, operand: Any, get: Callable[[dict], Any], where: str) -> Predicate:
    kind = type(operand)
    if kind is str:
        def same(v):
            return type(v) is str
    elif kind is int or kind is float:
        if not math.isfinite(operand):
            raise ApiError(422, f"{where}: {op} needs a finite number")

        def same(v):
            return type(v) is int or type(v) is float
    else:
        raise ApiError(422, f"{where}: {op} needs a number or a string")
    if op == "$gt":
        return lambda doc: same(v := get(doc)) and v > operand
    if op == "$gte":
        return lambda doc: same(v := get(doc)) and v >= operand
    if op == "$lt":
        return lambda doc: same(v := get(doc)) and v < operand
    return lambda doc: same(v := get(doc)) and v <= operand


def _all_of(parts: list[Predicate]) -> Predicate:
    parts = [p for p in parts if p is not _always]
    if not parts:
        return _always
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2:
        a, b = parts
        return lambda doc: a(doc) and b(doc)
    members = tuple(parts)
    return lambda doc: all(p(doc) for p in members)


def _any_of(parts: list[Predicate]) -> Predicate:
    if any(p is _always for p in parts):
        return _always
    if len(parts) == 1:
        return parts[0]
    members = tuple(parts)
    return lambda doc: any(p(doc) for p in members)
