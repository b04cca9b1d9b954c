"""The event-type catalog: each (type, version) with a JSON Schema for its `data`.

Thin events carry ids, versions and times only: no content, no personal data. A schema
describes those fields; an incompatible change is a new version, never an edit.
"""

from __future__ import annotations

import contextvars
import functools
import json
import threading
import time
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass

import jsonschema
import re2
import referencing.exceptions
from flask import current_app
from sqlalchemy import Row, bindparam, select
from sqlalchemy.exc import IntegrityError

from dashboard import audit
from dashboard.core import paging
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError, compact_json, nesting_depth
from dashboard.ingest import quotas
from dashboard.models import EventType, Team
from dashboard.schemas import EventTypeInput

MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 64  # JSON containers; a schema for thin events needs a handful
# Subschemas a schema amounts to once every $ref is replaced by what it names: what validating one value
# may walk. A chain of $refs that each name the next twice doubles it at each level.
MAX_SCHEMA_EXPANSION = 1_000
MAX_EXPANDED_DEPTH = 128  # JSON containers once $refs are followed
# The work one event's validation may do (data that makes a schema walk much of itself many times is
# refused, not validated at any cost): keyword checks, an enum's weighing its length / 8; and, as a
# backstop for work no step counts, CPU seconds of the thread (a garbage collection counts too: generous).
MAX_VALIDATION_STEPS = 5_000
MAX_VALIDATION_SECONDS = 0.25
# What one request may spend on all its events (a batch), and a declaration on trying its schema.
MAX_REQUEST_VALIDATION_STEPS = 50_000
MAX_REQUEST_VALIDATION_SECONDS = 0.5
# Instances a declared schema is tried on before it is accepted: one that recurses without end on
# any of them would do so on every event of that type.
_TRIAL_INSTANCES = ({}, [], "", 0, None)


def declare(team: Team, body: EventTypeInput) -> EventType:
    """Store a declaration within the team's rate and catalog quotas, its schema bounded (check_schema)."""
    quotas.check_declaration_rate(team)  # refused declarations count too: checking a schema costs CPU
    schema = body.json_schema
    validator = check_schema(schema)
    quotas.check_catalog_room(team, body.name, stored_size(schema, body.description))
    declared = EventType(team_id=team.id, name=body.name, version=body.version, description=body.description,
                         schema=schema, created_at=current_app.config["CLOCK"].now())
    db.session.add(declared)
    audit.record("event_type.declared", team_id=team.id, target=f"event_type:{body.name}@{body.version}")
    try:
        db.session.commit()
    except IntegrityError:
        db.session.rollback()
        raise ApiError(409, f"{body.name} version {body.version} is already declared; versions are immutable, "
                            f"declare version {body.version + 1} for an incompatible change") from None
    Compiled.for_app(current_app).keep((declared.id, declared.name, declared.version), validator)
    return declared


def stored_size(schema: dict, description: str) -> int:
    """What a declaration adds to the catalog_bytes quota: its schema and description as the database keeps them."""
    return len(json.dumps(schema)) + len(description)


def check_schema(schema: dict):
    """A schema Promesa can check every event against, quickly, without reaching outside: small, not
    deeply nested, not much larger once its $refs are followed, only local references, only patterns RE2
    can match in linear time. Returns its validator."""
    size = len(compact_json(schema, "schema").encode("utf-8"))
    if size > MAX_SCHEMA_BYTES:
        raise ApiError(413, f"schema is {size} bytes; the cap is {MAX_SCHEMA_BYTES} bytes")
    depth = nesting_depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise ApiError(422, f"schema is nested {depth} levels deep; at most {MAX_SCHEMA_DEPTH} (depth)")
    for node in _subschemas(schema):
        if node is not schema and isinstance(node.get("$id"), str):
            raise ApiError(422, f"schema may name itself ($id) at its root only, not {node['$id']!r} inside: "
                                "each $ref must name what Promesa sized at declaration")
    for keyword, value in _keywords(schema):
        if keyword in ("$ref", "$dynamicRef") and isinstance(value, str):
            if not value.startswith("#"):
                raise ApiError(422, f"schema may refer only to itself ('#/$defs/...'), not to {value!r}: "
                                    "Promesa fetches nothing")
            if value.startswith("#/") and _pointer(schema, value) is None:
                raise ApiError(422, f"schema $ref {value!r} cannot be resolved inside the schema")
        elif keyword == "pattern" and isinstance(value, str):
            _refuse_unless_re2(value)
        elif keyword == "patternProperties" and isinstance(value, dict):
            for pattern in value:
                _refuse_unless_re2(pattern)
    if _loops_in_place(schema):
        raise ApiError(422, "schema refers to itself without end (a $ref cycle that never descends into "
                            "the data)")
    expanded, expanded_depth = expansion(schema)
    if expanded > MAX_SCHEMA_EXPANSION:
        raise ApiError(422, f"schema expands to {expanded} subschemas once its $refs are followed, "
                            f"{expanded - MAX_SCHEMA_EXPANSION} past the cap of {MAX_SCHEMA_EXPANSION} "
                            "($ref expansion): every event would be checked against all of them")
    if expanded_depth > MAX_EXPANDED_DEPTH:
        raise ApiError(422, f"schema is nested {expanded_depth} levels deep once its $refs are followed, "
                            f"{expanded_depth - MAX_EXPANDED_DEPTH} past the cap of {MAX_EXPANDED_DEPTH} "
                            "($ref depth)")
    try:
        validator_class = _validator_class(jsonschema.validators.validator_for(schema))
        validator_class.check_schema(schema)
        validator = validator_class(schema)
        trials = Budget(2 * MAX_VALIDATION_STEPS, 2 * MAX_VALIDATION_SECONDS, "the budget of a declaration")
        for instance in _TRIAL_INSTANCES:
            _errors(validator, instance, trials)
    except OverBudget as over:
        raise ApiError(422, f"schema takes {over} to check empty values: simplify it") from None
    except jsonschema.SchemaError as exc:
        raise ApiError(422, f"schema is not a valid JSON Schema: {exc.message}") from None
    except RecursionError:
        raise ApiError(422, "schema refers to itself without end (a $ref cycle that never descends into "
                            "the data)") from None
    except referencing.exceptions.Unresolvable as exc:
        raise ApiError(422, f"schema has a reference that cannot be resolved: {exc}") from None
    return validator


# Values under these keywords are data, not schemas: a {"pattern": ...} inside an enum is no pattern.
_DATA_KEYWORDS = {"enum", "const", "default", "examples"}
# Definitions are walked only where a $ref names them.
_DEFINITIONS = {"$defs", "definitions"}


def expansion(schema) -> tuple[int, int]:
    """(subschemas, levels of JSON containers) validation may walk: the schema from its root, every local $ref
    replaced by what it names (definitions count where they are named); each target is sized once, so the sum
    is found without walking it. A $ref back into its own ancestors (recursion, bounded by the data) counts
    once. Past the interpreter's stack: a depth past any cap."""
    sized: dict[int, tuple[int, int]] = {}  # id(target) -> its expansion
    following: set[int] = set()  # targets on the current path

    def size(node) -> tuple[int, int]:
        count, deepest = (1, 0) if isinstance(node, dict) else (0, 0)
        for key, value in (node.items() if isinstance(node, dict) else enumerate(node)):
            if isinstance(node, dict) and (key in _DATA_KEYWORDS or key in _DEFINITIONS):
                continue
            if key in ("$ref", "$dynamicRef") and isinstance(node, dict) and isinstance(value, str):
                target = _target(schema, value)
                if target is not None and id(target) not in following:
                    if id(target) not in sized:
                        following.add(id(target))
                        sized[id(target)] = size(target)
                        following.discard(id(target))
                    count, deepest = count + sized[id(target)][0], max(deepest, sized[id(target)][1])
            elif isinstance(value, (dict, list)):
                more, depth = size(value)
                count, deepest = count + more, max(deepest, depth)
        return count, deepest + 1

    try:
        return size(schema)
    except RecursionError:
        return sum(1 for _ in _keywords(schema)), MAX_EXPANDED_DEPTH + 1


# Keywords whose subschemas apply to the same value as their parent: a cycle through only these never ends.
_IN_PLACE = {"allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies"}


def _loops_in_place(schema) -> bool:
    """Whether some $ref chain returns to a subschema without descending into the data on the way
    (`{"$ref": "#"}`, or two definitions naming each other): validation would recurse until the stack ends."""
    done: set[int] = set()
    path: set[int] = set()

    def same_value(node) -> list:
        """The subschemas that apply to the very value `node` applies to."""
        nexts = []
        for key, value in node.items():
            if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                nexts.append(_target(schema, value))
            elif key in _IN_PLACE:
                nexts.extend(value if isinstance(value, list) else
                             value.values() if key in ("dependentSchemas", "dependencies") and isinstance(value, dict)
                             else [value])
        return [n for n in nexts if isinstance(n, dict)]

    def loops(node) -> bool:  # depth-first, each subschema once; `path` holds the chain being followed
        if id(node) in path:
            return True
        if id(node) in done:
            return False
        path.add(id(node))
        found = any(loops(n) for n in same_value(node))
        path.discard(id(node))
        done.add(id(node))
        return found

    try:
        return any(loops(node) for node in _subschemas(schema))
    except RecursionError:
        return True


def _target(schema, ref: str):
    """The subschema a local reference names: a JSON pointer ('#/$defs/a'), the root ('#'), or an anchor."""
    if ref == "#":
        return schema
    if ref.startswith("#/"):
        return _pointer(schema, ref)
    if ref.startswith("#"):
        return next((node for node in _subschemas(schema)
                     if ref[1:] in (node.get("$anchor"), node.get("$dynamicAnchor"))), None)
    return None


def _subschemas(schema):
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(value for key, value in node.items() if key not in _DATA_KEYWORDS)
        elif isinstance(node, list):
            stack.extend(node)


def _keywords(schema):
    """Every (keyword, value) pair in the schema's objects, without recursion."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                yield key, value
                if key not in _DATA_KEYWORDS:
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)


def _pointer(schema, ref: str):
    """What a local JSON pointer ('#/$defs/a') names in the schema, or None."""
    node = schema
    for token in ref[2:].split("/"):
        token = urllib.parse.unquote(token).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


@functools.lru_cache(maxsize=1024)
def _re2(pattern: str):
    return re2.compile(pattern, _RE2_OPTIONS)


def _refuse_unless_re2(pattern: str) -> None:
    try:
        _re2(pattern)
    except re2.error:
        raise ApiError(422, f"pattern {pattern!r} is not supported: patterns are matched with RE2, in time "
                            "linear in the input (no backreferences, no lookaround)") from None


# A team's schema runs on every event of its type, in the web process every team shares: its
# patterns are matched by RE2, which cannot backtrack, instead of Python's re ("^(a+)+$" on 30
# characters held a thread for seconds).
def _re2_pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not _re2(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _re2_pattern_properties(validator, pattern_properties, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        for key, value in instance.items():
            if _re2(pattern).search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


class OverBudget(Exception):
    """A validation did more work than its budget allows; says which."""


@dataclass
class Budget:
    """What the validations of one request may still spend together: a batch's events, a declaration's trials."""
    steps: int = MAX_REQUEST_VALIDATION_STEPS
    seconds: float = MAX_REQUEST_VALIDATION_SECONDS
    words: str = "the budget of one request's events: send fewer events per batch"
    deadline: float | None = None  # (the thread's CPU clock, from the first validation)


# [steps left, CPU deadline, steps left at the next look at the clock, (words for steps, words for CPU)]
# of the validation running
_spent = contextvars.ContextVar("validation_spent")


def _counted(check, weighs=lambda value: 1):
    """The keyword check, first charging its weight in steps to the validation running (and every 64th step or
    so, looking at the thread's CPU clock): validation stops within a bounded amount of work, in this thread,
    without a timer."""
    def counted(validator, value, instance, schema):
        budget = _spent.get(None)
        if budget is not None:
            left = budget[0] = budget[0] - weighs(value)
            if left < 0:
                raise OverBudget(budget[3][0])
            if left < budget[2]:
                budget[2] = left - 64
                if time.thread_time() > budget[1]:
                    raise OverBudget(budget[3][1])
                time.sleep(0)  # lets the other threads of this process in: a long validation queues no one
        return check(validator, value, instance, schema)
    return counted


def _enum_weight(value) -> int:
    return 1 + len(value) // 8 if isinstance(value, list) else 1


def _unique_items(validator, unique, instance, schema):
    """uniqueItems in time linear in the array (jsonschema compares unsortable items pairwise)."""
    if unique and validator.is_type(instance, "array"):
        seen = set()
        for item in instance:
            if (frozen := _frozen(item)) in seen:
                yield jsonschema.ValidationError(f"{instance!r} has non-unique elements")
                return
            seen.add(frozen)


def _frozen(value):
    """A hashable value equal where JSON Schema says equal: 1 and 1.0 are, true and 1 are not."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, list):
        return ("list", tuple(_frozen(item) for item in value))
    if isinstance(value, dict):
        return ("object", frozenset((key, _frozen(item)) for key, item in value.items()))
    return value


def _errors(validator, data, shared: Budget):
    """The best of data's errors (None when valid), within one event's budget and what is left of the request's
    (OverBudget past either)."""
    now = time.thread_time()
    if shared.deadline is None:
        shared.deadline = now + shared.seconds
    own = (f"more than {MAX_VALIDATION_STEPS} schema checks, the budget of one event",
           f"more than {MAX_VALIDATION_SECONDS * 1000:.0f} ms of CPU, the budget of one event")
    steps, deadline = min(MAX_VALIDATION_STEPS, shared.steps), min(now + MAX_VALIDATION_SECONDS, shared.deadline)
    words = (own[0] if steps == MAX_VALIDATION_STEPS else f"more schema checks than are left of {shared.words}",
             own[1] if deadline == now + MAX_VALIDATION_SECONDS else f"more CPU than is left of {shared.words}")
    budget = [steps, deadline, steps - 64, words]  # (a short validation never looks at the clock)
    token = _spent.set(budget)
    try:
        return jsonschema.exceptions.best_match(validator.iter_errors(data))
    finally:
        _spent.reset(token)
        shared.steps -= steps - max(budget[0], 0)


@functools.lru_cache(maxsize=16)
def _validator_class(base):
    """The draft's validator class, matching patterns with RE2, every keyword charged to the budget."""
    checks = base.VALIDATORS | {"pattern": _re2_pattern, "patternProperties": _re2_pattern_properties,
                                "uniqueItems": _unique_items}
    return jsonschema.validators.extend(base, validators={
        keyword: _counted(check, _enum_weight if keyword == "enum" else lambda value: 1)
        for keyword, check in checks.items()})


def compile_schema(schema: dict):
    return _validator_class(jsonschema.validators.validator_for(schema))(schema)


class Compiled:
    """A web process's validators, one per declaration (by its id, name and version: a declaration never
    changes, a new version is a new row), shared by every request and thread; the least recently used go."""

    def __init__(self, size: int = 512):
        self.size, self.compiled = size, 0  # compiled: how many were built (each costs a schema walk)
        self.validators: OrderedDict[tuple, object] = OrderedDict()
        self.lock = threading.Lock()

    @classmethod
    def for_app(cls, app) -> Compiled:
        return app.extensions.setdefault("promesa_compiled_schemas", cls())

    def get(self, declared):
        key = (declared.id, declared.name, declared.version)
        with self.lock:
            validator = self.validators.get(key)
            if validator is not None:
                self.validators.move_to_end(key)
                return validator
        return self.keep(key, compile_schema(declared.schema))

    def keep(self, key: tuple, validator):
        with self.lock:
            self.compiled += 1
            self.validators[key] = validator
            while len(self.validators) > self.size:
                self.validators.popitem(last=False)
        return validator


def team_event_types(team: Team) -> list[EventType]:
    return db.session.scalars(select(EventType).where(EventType.team_id == team.id)
                              .order_by(EventType.name, EventType.version)).all()


def team_event_types_page(team: Team, limit: int, after: str | None) -> tuple[list[EventType], str | None]:
    """A page of the team's declarations, oldest first, and the next page's cursor (None on the last page)."""
    page, next_after = paging.by_id(select(EventType).where(EventType.team_id == team.id), EventType.id, limit,
                                    int(after) if after else None, newest_first=False)
    return page, None if next_after is None else str(next_after)


def team_event_type_names(team: Team) -> list[str]:
    """The names in the team's catalog (at most its event_types quota), without their schemas."""
    return db.session.scalars(select(EventType.name).where(EventType.team_id == team.id).distinct()
                              .order_by(EventType.name)).all()


# Built once: ingest asks on every request, and building and keying a statement costs more than running it.
# Columns, not the ORM entity: loading an entity costs more than the query on a single-event request.
_NAMED = select(EventType.id, EventType.name, EventType.version, EventType.schema) \
    .where(EventType.team_id == bindparam("team_id"), EventType.name == bindparam("name"))
_LATEST = _NAMED.order_by(EventType.version.desc()).limit(1)
_EXACT = _NAMED.where(EventType.version == bindparam("version"))


def resolve(team: Team, event_type: str, version: int | None) -> tuple[int, Row | None]:
    """The version an event is published as, and its declaration (id, name, version, schema) if there is one."""
    params = {"team_id": team.id, "name": event_type}
    if version is None:
        declared = db.session.execute(_LATEST, params).first()
    else:
        declared = db.session.execute(_EXACT, params | {"version": version}).first()
    return published(team, event_type, version, declared)


def published(team: Team, event_type: str, version: int | None, declared) -> tuple[int, Row | None]:
    """resolve's answer once the declaration is read (`declared`: the asked version's, or the latest when
    none was asked; None if the catalog has none): the asked version, else the latest declared, else 1."""
    if version is None:
        version = declared.version if declared else 1
    if declared is None and team.strict_event_types:
        raise ApiError(422, f"event type {event_type!r} version {version} is not declared in the catalog, "
                            "and this team accepts declared types only (strict mode)")
    return version, declared


def validate_data(declared: EventType | Row, data: dict, budget: Budget | None = None) -> None:
    """422 unless data fits the declaration's schema; `budget`: what the request's validations may still spend."""
    validator = Compiled.for_app(current_app).get(declared)
    try:
        error = _errors(validator, data, Budget() if budget is None else budget)
    except OverBudget as over:
        raise ApiError(422, f"checking data against the schema of {declared.name} v{declared.version} took {over}; "
                            "send smaller data, or declare a simpler version") from None
    except RecursionError:  # declared before check_schema tried its schemas on sample data
        raise ApiError(422, f"the schema of {declared.name} v{declared.version} refers to itself without end; "
                            "declare a new version") from None
    except referencing.exceptions.Unresolvable as exc:
        raise ApiError(422, f"the schema of {declared.name} v{declared.version} has a reference that cannot be "
                            f"resolved ({exc}); declare a new version") from None
    if error is not None:
        where = "data" + "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        raise ApiError(422, f"{where}: {error.message} (schema of {declared.name} v{declared.version})")
