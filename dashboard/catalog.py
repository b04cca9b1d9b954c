"""The event-type catalog: each (type, version) with a JSON Schema for its `data`.

Thin events carry ids, versions and times only: no content, no personal data. A schema
describes those fields; an incompatible change is a new version, never an edit.
"""

from __future__ import annotations

import jsonschema
from flask import current_app
from sqlalchemy import Row, bindparam, select
from sqlalchemy.exc import IntegrityError

from .clock import iso
from .extensions import db
from .validation import TYPE_RE, ApiError, check_fields
from .models import EventType, Team

FIELDS = {"name", "version", "description", "schema"}


def declare(team: Team, payload) -> EventType:
    check_fields(payload, FIELDS, {"name", "schema"})
    name = payload["name"]
    if not isinstance(name, str) or not TYPE_RE.match(name):
        raise ApiError(400, "name must be a string of letters, digits, '.', '_' or '-' (at most 200)")
    version = payload.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= 10_000:
        raise ApiError(400, "version must be a whole number from 1 to 10000")
    description = payload.get("description", "")
    if not isinstance(description, str) or len(description) > 1000:
        raise ApiError(400, "description must be a string of at most 1000 characters")
    schema = payload["schema"]
    if not isinstance(schema, dict):
        raise ApiError(400, "schema must be a JSON Schema object")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ApiError(422, f"schema is not a valid JSON Schema: {exc.message}") from None
    declared = EventType(team_id=team.id, name=name, version=version, description=description, schema=schema,
                         created_at=current_app.config["CLOCK"].now())
    db.session.add(declared)
    try:
        db.session.commit()
    except IntegrityError:
        db.session.rollback()
        raise ApiError(409, f"{name} version {version} is already declared; versions are immutable, "
                            f"declare version {version + 1} for an incompatible change") from None
    return declared


def for_team(team: Team) -> list[EventType]:
    return db.session.scalars(select(EventType).where(EventType.team_id == team.id)
                              .order_by(EventType.name, EventType.version)).all()


# Built once: ingest asks on every request, and building and keying a statement cost more than running it.
# Columns, not the ORM entity: loading an entity cost more than the query on a single-event request.
_NAMED = select(EventType.name, EventType.version, EventType.schema) \
    .where(EventType.team_id == bindparam("team_id"), EventType.name == bindparam("name"))
_LATEST = _NAMED.order_by(EventType.version.desc()).limit(1)
_EXACT = _NAMED.where(EventType.version == bindparam("version"))


def resolve(team: Team, event_type: str, version: int | None) -> tuple[int, Row | None]:
    """The version an event is published as, and its declaration (name, version, schema) if there is one."""
    params = {"team_id": team.id, "name": event_type}
    if version is None:
        declared = db.session.execute(_LATEST, params).first()
        version = declared.version if declared else 1
    else:
        declared = db.session.execute(_EXACT, params | {"version": version}).first()
    if declared is None and team.strict_event_types:
        raise ApiError(422, f"event type {event_type!r} version {version} is not declared in the catalog, "
                            "and this team accepts declared types only (strict mode)")
    return version, declared


def validate_data(declared: EventType | Row, data: dict) -> None:
    validator = jsonschema.validators.validator_for(declared.schema)(declared.schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        where = "data" + "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        raise ApiError(422, f"{where}: {error.message} (schema of {declared.name} v{declared.version})")


def describe(declared: EventType) -> dict:
    return {"name": declared.name, "version": declared.version, "description": declared.description,
            "schema": declared.schema, "created_at": iso(declared.created_at)}
