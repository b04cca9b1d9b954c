"""Client errors shared by the API and the services behind it: say what is wrong, store nothing.

Request bodies are pydantic models (see `dashboard.schemas`), built from the constrained
types below; the same models write the OpenAPI document, so what is documented is what is
checked. `parse_json(Model, raw)` validates a body and turns pydantic's errors into one
`ApiError` that names the field and says why, in the words of the field's `Must(...)`.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, RootModel, ValidationError

TYPE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$"
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,63}$"  # a producer's event id, and every id in a path
# Text PostgreSQL can store: it refuses NUL. (An unpaired surrogate never gets this far: the JSON parser refuses it.)
NO_NUL = r"^[^\x00]*$"
MAX_VERSION = 10_000
MAX_DATA_DEPTH = 32  # thin events carry ids and versions: 32 levels is far more than one needs


class ApiError(Exception):
    """A client error with the HTTP status that says what kind it is."""

    fields: dict = {}  # more members of the JSON error body (a quota's name and limit)
    headers: dict = {}  # headers of the answer (Retry-After)

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def invalid_token() -> ApiError:
    return ApiError(401, "invalid or revoked token")


def expired_token(expired_at) -> ApiError:
    return ApiError(401, f"this token expired at {expired_at.strftime('%Y-%m-%d %H:%M')} UTC; "
                         "ask an owner for a new one")


class Must:
    """What a field must be, in words: the error message when it is not (`<field> must be <what>`)."""

    __slots__ = ("what",)

    def __init__(self, what: str):
        self.what = what


class Body(BaseModel):
    """A request body: strict types (no "5" for 5, no 1 for true), no unknown fields, no NaN."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)


def _whole_float_as_int(value):
    # JSON Schema counts 5.0 as an integer, so a document generated from these models promises it.
    return int(value) if isinstance(value, float) and value.is_integer() else value


WholeNumber = BeforeValidator(_whole_float_as_int)


def keys_matching(schema: dict) -> None:
    """For a dict whose keys have a pattern: pydantic writes patternProperties, which lets any other
    key through; the document must say what is checked, that every key matches (propertyNames)."""
    [(pattern, values)] = schema.pop("patternProperties").items()
    schema["propertyNames"] = {"pattern": pattern}
    schema["additionalProperties"] = values


# The constrained types every body is made of.
TypeName = Annotated[str, Field(pattern=TYPE_PATTERN, examples=["file.updated"]),
                     Must("a string of letters, digits, '.', '_' or '-' (at most 200), like 'file.updated'")]
# Promesa's own event types (checks, operational events): a producer cannot send or declare them.
RESERVED_TYPE_PREFIX = "promesa."


def refuse_reserved(name: str, where: str) -> None:
    """422 for a producer's type in Promesa's own prefix: well-formed (the schema allows it), but not theirs."""
    if name.lower().startswith(RESERVED_TYPE_PREFIX):
        raise ApiError(422, f"{where}: types starting with {RESERVED_TYPE_PREFIX!r} are Promesa's own")


ProducerTypeName = Annotated[str, Field(pattern=TYPE_PATTERN, examples=["file.updated"],
                                        description=f"not starting with '{RESERVED_TYPE_PREFIX}' (reserved)"),
                             Must("a string of letters, digits, '.', '_' or '-' (at most 200), like 'file.updated', "
                                  f"not starting with '{RESERVED_TYPE_PREFIX}' (Promesa's own types)")]
TypePattern = Annotated[str, Field(pattern=r"^[A-Za-z0-9*][A-Za-z0-9_.\-*]{0,199}$", examples=["file.*"])]
Version = Annotated[int, Field(ge=1, le=MAX_VERSION), WholeNumber, Must(f"a whole number from 1 to {MAX_VERSION}")]


def text(max_length: int, **field) -> Any:
    """A free-text string of at most `max_length` characters, without NUL."""
    return Annotated[str, Field(max_length=max_length, pattern=NO_NUL, **field),
                     Must(f"a string of at most {max_length} characters, without NUL characters")]


def parse_json(model: type[BaseModel], raw: bytes | str) -> BaseModel:
    """The body as `model`, or an ApiError(400) that names the first thing wrong."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise ApiError(400, explain(model, exc)) from None


def explain(model: type[BaseModel], exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    # An unknown field first: a misspelt field is also a missing one, and the misspelling is the news.
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    if first["type"] == "json_invalid":
        if "recursion limit" in first["msg"]:
            return "the body is nested too deeply to read"
        return f"the body is not valid JSON ({first['msg'].removeprefix('Invalid JSON: ')})"
    where, owner, field, name = _locate(model, first["loc"])
    if field is None and first["type"] in ("model_type", "model_attributes_type"):
        return f"{where or 'the body'} must be a JSON object"
    if first["type"] in ("extra_forbidden", "missing"):
        # Unknown and missing fields are named all at once, as a producer fixes them all at once.
        names = ", ".join(str(e["loc"][-1]) for e in errors
                          if e["type"] == first["type"] and e["loc"][:-1] == first["loc"][:-1])
        if first["type"] == "extra_forbidden":
            message = f"unknown field(s): {names}; allowed: {', '.join(sorted(_fields_by_json_name(owner)))}"
        else:
            message = f"missing required field(s): {names}"
    else:
        must = next((m.what for m in (field.metadata if field else ()) if isinstance(m, Must)), None)
        message = f"{name} must be {must}" if must else f"{name or 'the body'}: {first['msg']}"
    return f"{where}: {message}" if where else message


def _locate(model: type[BaseModel], loc: tuple) -> tuple[str, type[BaseModel] | None, Any, str | None]:
    """Where an error is: the path to the model holding the field ('events[1]'), that model, and the
    field's FieldInfo and name (None when the error is about the model as a whole)."""
    owner, field, name, where = model, None, None, ""
    if issubclass(model, RootModel):  # a list body: its items' fields are the ones to name
        owner = _model_in(model.model_fields["root"].annotation) or model
    for index, part in enumerate(loc):
        if field is not None:  # inside a field's value (a list item, a mapping's key): the field is to blame
            break
        if isinstance(part, int):
            where += f"[{part}]"
        elif (found := _fields_by_json_name(owner).get(part)) is not None:
            inner = _model_in(found.annotation)
            if inner is None or index == len(loc) - 1:  # a plain field, or the list of models itself
                field, name = found, part
            else:
                owner, where = inner, f"{where}.{part}" if where else part
        else:
            name = str(part)
            break
    return where, owner, field, name


@functools.lru_cache(maxsize=None)
def _fields_by_json_name(model: type[BaseModel]) -> dict[str, Any]:
    """A model's fields by the name they have in JSON (the alias, where there is one)."""
    return {info.alias or name: info for name, info in model.model_fields.items()}


def _model_in(annotation) -> type[BaseModel] | None:
    """The model a field holds directly or as a list of them."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def parse_time(value, name: str) -> dt.datetime | None:
    """A time as naive UTC; None if empty. An ISO 8601 string (a browser's datetime-local value, which has
    no zone, counts as UTC) or a datetime; 400 if it is neither, 422 if its UTC is outside years 1 to 9999."""
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        when = value
    elif isinstance(value, str):
        try:
            when = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ApiError(400, f"{name} must be an ISO 8601 time such as 2026-11-30T09:00:00Z, not {value!r}") \
                from None
    else:
        raise ApiError(400, f"{name} must be an ISO 8601 time such as 2026-11-30T09:00:00Z")
    if when.tzinfo is None:
        return when
    try:
        return when.astimezone(dt.timezone.utc).replace(tzinfo=None)
    except OverflowError:  # 0001-01-01T00:00:00+14:00 is a valid time, but its UTC is before year 1
        shown = value.isoformat() if isinstance(value, dt.datetime) else repr(value)
        raise ApiError(422, f"{name} {shown} is outside years 1 to 9999 in UTC") from None


def compact_json(value, what: str) -> str:
    """`value` as compact JSON text, refusing NaN and Infinity (which no JSON parser reads back)."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise ApiError(400, f"{what} must not contain NaN or Infinity (JSON has no such numbers)") from None


def refuse_nul(value, where: str) -> None:
    """422 naming the first key or string inside `value` that holds NUL (PostgreSQL stores no NUL in text or jsonb):
    `where` is the JSON path of `value` itself, e.g. "data" gives "data.items[2].name"."""
    stack = [(value, where)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                raise ApiError(422, f"{path} must not contain NUL characters (\\u0000)")
        elif isinstance(node, dict):
            for key, child in reversed(node.items()):
                if "\x00" in key:
                    raise ApiError(422, f"{path} has a key with a NUL character (\\u0000) in it")
                stack.append((child, f"{path}.{key}" if _PLAIN_KEY.match(key) else f"{path}[{json.dumps(key)}]"))
        elif isinstance(node, list):
            stack.extend((child, f"{path}[{index}]") for index, child in reversed(list(enumerate(node))))


_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def nesting_depth(value) -> int:
    """How deeply lists and objects nest in `value` (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


# Ids are 64-bit signed integers in every database Promesa runs on.
MAX_ID = 2**63 - 1


def parse_id(raw: str | None, name: str) -> int | None:
    """A row id from a form or a query string: None when empty, 400 unless ASCII digits within 64 bits."""
    raw = (raw or "").strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_ID:
        raise ApiError(400, f"{name} must be a number from 1 to {MAX_ID}")
    return int(raw)
