"""Accepting events: validate, store the event and one delivery per matching subscription
in one transaction, and only then hand the delivery ids to the work queue."""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
import logging
import re

import redis

from flask import current_app
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from . import catalog
from .clock import iso
from .extensions import db
from .ids import new_id
from .models import Delivery, DeliveryState, Event, Subscription, SubscriptionState, Team
from .queue import WorkQueue
from .validation import TYPE_RE, ApiError, check_fields

log = logging.getLogger(__name__)

EVENT_FIELDS = {"type", "data", "id", "version", "timestamp"}
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,63}$")


def parse_occurred_at(value) -> dt.datetime | None:
    """The producer's "when it happened": RFC 3339 with a zone, stored as naive UTC."""
    if value is None:
        return None
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00")) if isinstance(value, str) else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise ApiError(400, "timestamp must be an RFC 3339 time with a zone, like 2026-11-29T18:00:00.123Z")
    return when.astimezone(dt.timezone.utc).replace(tzinfo=None)


def validate_event(payload) -> tuple[str, dict, str | None, int | None]:
    check_fields(payload, EVENT_FIELDS, {"type"})
    event_type = payload["type"]
    if not isinstance(event_type, str) or not TYPE_RE.match(event_type):
        raise ApiError(400, "type must be a string of letters, digits, '.', '_' or '-' (at most 200), like 'file.updated'")
    data = payload.get("data", {})
    if not isinstance(data, dict):
        raise ApiError(400, "data must be a JSON object")
    size = len(json.dumps(data, separators=(",", ":")).encode("utf-8"))
    cap = current_app.config["PROMESA_MAX_DATA_BYTES"]
    if size > cap:
        raise ApiError(413, f"data is {size} bytes; the cap is {cap} bytes (send ids and versions, not content)")
    event_id = payload.get("id")
    if event_id is not None and (not isinstance(event_id, str) or not ID_RE.match(event_id)):
        raise ApiError(400, "id must be a string of at most 64 letters, digits, '_', '-', '.' or ':'")
    version = payload.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
        raise ApiError(400, "version must be a whole number of at least 1")
    return event_type, data, event_id, version


def wants(sub: Subscription, event_type: str, version: int) -> bool:
    """Does the subscription take this type at this version?"""
    pinned = (sub.event_versions or {}).get(event_type)
    return (pinned is None or pinned == version) and any(fnmatch.fnmatchcase(event_type, p) for p in sub.event_types)


def thin_body(event_id: str, event_type: str, version: int, occurred_at, data: dict) -> str:
    return json.dumps({"id": event_id, "type": event_type, "version": version, "timestamp": iso(occurred_at),
                       "data": data}, separators=(",", ":"))


def _existing(team: Team, event_id: str | None, idempotency_key: str | None) -> Event | None:
    if idempotency_key:
        found = db.session.scalar(select(Event).where(Event.team_id == team.id,
                                                      Event.idempotency_key == idempotency_key))
        if found:
            return found
    if event_id:
        found = db.session.get(Event, event_id)
        if found is not None and found.team_id != team.id:
            raise ApiError(409, f"event id {event_id!r} is already used by another producer; choose another id")
        return found
    return None


def ingest(team: Team, payload, idempotency_key: str | None = None) -> tuple[Event, int, bool]:
    """Store an event and its deliveries; returns (event, deliveries, created)."""
    event_type, data, event_id, version = validate_event(payload)
    occurred_at = parse_occurred_at(payload.get("timestamp"))
    if idempotency_key is not None and not (0 < len(idempotency_key) <= 255):
        raise ApiError(400, "Idempotency-Key must be 1 to 255 characters")
    existing = _existing(team, event_id, idempotency_key)
    if existing is not None:
        return existing, len(existing.deliveries), False
    version, declared = catalog.resolve(team, event_type, version)
    if declared is not None:
        catalog.validate_data(declared, data)

    now = current_app.config["CLOCK"].now()
    event_id = event_id or new_id("evt")
    event = Event(id=event_id, team_id=team.id, type=event_type, version=version, data=data,
                  body=thin_body(event_id, event_type, version, occurred_at or now, data),
                  idempotency_key=idempotency_key, occurred_at=occurred_at or now, created_at=now)
    subscriptions = db.session.scalars(select(Subscription).where(Subscription.team_id == team.id)).all()
    ready = []
    for sub in subscriptions:
        if not wants(sub, event_type, version):
            continue
        active = sub.state == SubscriptionState.ACTIVE
        delivery = Delivery(id=new_id("dlv"), event=event, subscription_id=sub.id,
                            state=DeliveryState.PENDING if active else DeliveryState.HELD,
                            next_attempt_at=now, created_at=now, updated_at=now)
        db.session.add(delivery)
        if active:
            ready.append(delivery.id)
    db.session.add(event)
    try:
        db.session.commit()
    except IntegrityError:
        # Two requests with the same key or id raced: the first one won, answer with it.
        db.session.rollback()
        existing = _existing(team, event_id if payload.get("id") else None, idempotency_key)
        if existing is None:
            raise
        return existing, len(existing.deliveries), False
    enqueue(ready)
    return event, len(event.deliveries), True


def enqueue(delivery_ids: list[str]) -> None:
    """Hand committed deliveries to the workers. If Redis is down the sweeper enqueues them later."""
    if not delivery_ids:
        return
    try:
        WorkQueue.for_app().push(delivery_ids)
    except (redis.RedisError, OSError):  # accepted work is in the database: never fail the producer for Redis
        log.warning("could not enqueue %d deliveries; the sweeper will", len(delivery_ids), exc_info=True)
