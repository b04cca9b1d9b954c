"""The event-type catalog: each (type, version) with a JSON Schema for its `data`.

Thin events carry ids, versions and times only: no content, no personal data. A schema
describes those fields; an incompatible change is a new version, never an edit.
"""

from __future__ import annotations

import functools
import json
import urllib.parse

import jsonschema
import re2
import referencing.exceptions
from flask import current_app
from sqlalchemy import Row, bindparam, select
from sqlalchemy.exc import IntegrityError

from dashboard import audit
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError, compact_json, nesting_depth
from dashboard.models import EventType, Team
from dashboard.schemas import EventTypeInput

MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 64  # JSON containers; a schema for thin events needs a handful
# Instances a declared schema is tried on before it is accepted: one that recurses without end on
# any of them would do so on every event of that type.
_TRIAL_INSTANCES = ({}, [], "", 0, None)


def declare(team: Team, body: EventTypeInput) -> EventType:
    schema = body.json_schema
    check_schema(schema)
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
    return declared


def check_schema(schema: dict) -> None:
    """A schema Promesa can check every event against, quickly, without reaching outside: small, not
    deeply nested, only local references, only patterns RE2 can match in linear time."""
    size = len(compact_json(schema, "schema").encode("utf-8"))
    if size > MAX_SCHEMA_BYTES:
        raise ApiError(413, f"schema is {size} bytes; the cap is {MAX_SCHEMA_BYTES} bytes")
    depth = nesting_depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise ApiError(422, f"schema is nested {depth} levels deep; at most {MAX_SCHEMA_DEPTH}")
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
    try:
        validator_class = _validator_class(jsonschema.validators.validator_for(schema))
        validator_class.check_schema(schema)
        validator = validator_class(schema)
        for instance in _TRIAL_INSTANCES:
            validator.is_valid(instance)
    except jsonschema.SchemaError as exc:
        raise ApiError(422, f"schema is not a valid JSON Schema: {exc.message}") from None
    except RecursionError:
        raise ApiError(422, "schema refers to itself without end (a $ref cycle that never descends into "
                            "the data)") from None
    except referencing.exceptions.Unresolvable as exc:
        raise ApiError(422, f"schema has a reference that cannot be resolved: {exc}") from None


# Values under these keywords are data, not schemas: a {"pattern": ...} inside an enum is no pattern.
_DATA_KEYWORDS = {"enum", "const", "default", "examples"}


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


@functools.lru_cache(maxsize=16)
def _validator_class(base):
    """The draft's validator class, matching patterns with RE2."""
    return jsonschema.validators.extend(base, validators={"pattern": _re2_pattern,
                                                          "patternProperties": _re2_pattern_properties})


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str):
    """One validator per distinct schema text (declarations never change: a new version is a new row)."""
    schema = json.loads(schema_json)
    return _validator_class(jsonschema.validators.validator_for(schema))(schema)


def team_event_types(team: Team) -> list[EventType]:
    return db.session.scalars(select(EventType).where(EventType.team_id == team.id)
                              .order_by(EventType.name, EventType.version)).all()


# Built once: ingest asks on every request, and building and keying a statement costs more than running it.
# Columns, not the ORM entity: loading an entity costs more than the query on a single-event request.
_NAMED = select(EventType.name, EventType.version, EventType.schema) \
    .where(EventType.team_id == bindparam("team_id"), EventType.name == bindparam("name"))
_LATEST = _NAMED.order_by(EventType.version.desc()).limit(1)
_EXACT = _NAMED.where(EventType.version == bindparam("version"))


def resolve(team: Team, event_type: str, version: int | None) -> tuple[int, Row | None]:
    """The version an event is published as, and its declaration (name, version, schema) if there is one."""
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


def validate_data(declared: EventType | Row, data: dict) -> None:
    validator = _validator(json.dumps(declared.schema, sort_keys=True, separators=(",", ":")))
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    except RecursionError:  # declared before check_schema tried its schemas on sample data
        raise ApiError(422, f"the schema of {declared.name} v{declared.version} refers to itself without end; "
                            "declare a new version") from None
    except referencing.exceptions.Unresolvable as exc:
        raise ApiError(422, f"the schema of {declared.name} v{declared.version} has a reference that cannot be "
                            f"resolved ({exc}); declare a new version") from None
    if error is not None:
        where = "data" + "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        raise ApiError(422, f"{where}: {error.message} (schema of {declared.name} v{declared.version})")
