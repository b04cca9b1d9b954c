"""Accepting events: validate, store the event and one delivery per matching subscription
in one transaction, and only then hand the delivery ids to the work queue."""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
import logging
import re
from dataclasses import dataclass

import redis

from flask import current_app
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from . import catalog
from .clock import iso
from .extensions import db
from .ids import new_id
from .models import Delivery, DeliveryState, Event, Subscription, SubscriptionState, Team
from .queue import WorkQueue, work_item
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


@dataclass(frozen=True)
class Accepted:
    id: str
    deliveries: int
    duplicate: bool


MAX_BATCH = 500


def ingest(team: Team, payload, idempotency_key: str | None = None) -> Accepted:
    """Store one event and its deliveries (or find the first one, for a repeated key or id)."""
    if idempotency_key is not None and not (0 < len(idempotency_key) <= 255):
        raise ApiError(400, "Idempotency-Key must be 1 to 255 characters")
    return ingest_many(team, [payload], idempotency_key, numbered=False)[0]


def ingest_many(team: Team, payloads: list, idempotency_key: str | None = None,
                numbered: bool = True) -> list[Accepted]:
    """Validate every event first, then store them all and their deliveries in one transaction,
    then enqueue. One bad event rejects the whole batch: nothing is stored half-way."""
    def at(index: int, exc: ApiError) -> ApiError:
        """In a batch, an error names the event it is about."""
        return ApiError(exc.status, f"events[{index}]: {exc.message}") if numbered else exc

    checked = []
    for index, payload in enumerate(payloads):
        try:
            event_type, data, event_id, version = validate_event(payload)
            checked.append((event_type, data, event_id, version, parse_occurred_at(payload.get("timestamp"))))
        except ApiError as exc:
            raise at(index, exc) from None

    now = current_app.config["CLOCK"].now()
    subscriptions = db.session.scalars(select(Subscription).where(Subscription.team_id == team.id)).all()
    resolved: dict[tuple, tuple] = {}  # (type, asked version) -> (version, declaration): one lookup per batch
    results: list[Accepted | None] = []
    seen: dict[str, int] = {}  # an id repeated inside the batch is a duplicate of its first appearance
    events, deliveries, ready = [], [], []
    for index, (event_type, data, event_id, version, occurred_at) in enumerate(checked):
        if event_id in seen:
            results.append(None)
            continue
        existing = _existing(team, event_id, idempotency_key)
        if existing is not None:
            results.append(Accepted(existing.id, len(existing.deliveries), True))
            continue
        if (event_type, version) not in resolved:
            resolved[(event_type, version)] = catalog.resolve(team, event_type, version)
        version, declared = resolved[(event_type, version)]
        if declared is not None:
            try:
                catalog.validate_data(declared, data)
            except ApiError as exc:
                raise at(index, exc) from None
        event_id = event_id or new_id("evt")
        seen[event_id] = index
        when = occurred_at or now
        events.append({"id": event_id, "team_id": team.id, "type": event_type, "version": version, "data": data,
                       "body": thin_body(event_id, event_type, version, when, data),
                       "idempotency_key": idempotency_key, "occurred_at": when, "created_at": now})
        count = 0
        for sub in subscriptions:
            if not wants(sub, event_type, version):
                continue
            active = sub.state == SubscriptionState.ACTIVE
            delivery_id = new_id("dlv")
            deliveries.append({"id": delivery_id, "event_id": event_id, "subscription_id": sub.id,
                               "state": DeliveryState.PENDING if active else DeliveryState.HELD,
                               "attempt_count": 0, "retry_base": 0, "next_attempt_at": now,
                               "created_at": now, "updated_at": now})
            count += 1
            if active:
                ready.append(work_item(sub.id, delivery_id))
        results.append(Accepted(event_id, count, False))
    if events:
        try:
            db.session.execute(insert(Event), events)
            if deliveries:
                db.session.execute(insert(Delivery), deliveries)
            db.session.commit()
        except IntegrityError:
            db.session.rollback()
            if numbered:
                raise ApiError(409, "another request stored one of these event ids at the same moment; "
                                    "send the batch again (ids already stored come back as duplicates)") from None
            # Two requests with the same key or id raced: the first one won, answer with it.
            existing = _existing(team, checked[0][2], idempotency_key)
            if existing is None:
                raise
            return [Accepted(existing.id, len(existing.deliveries), True)]
    enqueue(ready)
    for i, result in enumerate(results):
        if result is None:  # repeated inside the batch: the first one's answer, marked as a duplicate
            first = results[seen[checked[i][2]]]
            results[i] = Accepted(first.id, first.deliveries, True)
    return results


def enqueue(items: list[str]) -> None:
    """Hand committed deliveries (work items) to the workers. If Redis is down the sweeper enqueues them later."""
    if not items:
        return
    try:
        WorkQueue.for_app().push(items)
    except (redis.RedisError, OSError):  # accepted work is in the database: never fail the producer for Redis
        log.warning("could not enqueue %d deliveries; the sweeper will", len(items), exc_info=True)
