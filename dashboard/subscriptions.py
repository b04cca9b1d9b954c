"""What can be done to a subscription, shared by the JSON API and the dashboard."""

from __future__ import annotations

import math

from flask import current_app
from sqlalchemy import or_, select, update

from . import audit, crypto, rotation, signing
from .clock import iso
from .delivery.policies import POLICY_NAMES
from .delivery.targets import url_problem
from .extensions import db
from .ids import new_ids
from .ingest import enqueue, ingest_many
from .queue import work_item
from .validation import ApiError, check_fields
from .models import Delivery, DeliveryState, Subscription, SubscriptionState, Team

SCHEMES = ("promesa", "standard-webhooks")
# What an owner may change after creation (the signature scheme is fixed: receivers verify by it).
EDITABLE = {"url", "event_types", "event_versions", "retry_policy", "description", "connect_timeout",
            "attempt_timeout", "max_age_seconds", "rate_limit_per_s", "max_in_flight"}
FIELDS = EDITABLE | {"signature_scheme"}
MAX_RATE_LIMIT_PER_S = 10_000
MAX_IN_FLIGHT = 64


def _number(payload, name, low, high, default):
    value = payload.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise ApiError(400, f"{name} must be a number from {low} to {high}")
    return value


# Each field: its default at creation, and how it is checked (payload -> stored value).
def _url(payload):
    url = payload["url"]
    problem = url_problem(url, current_app.config["PROMESA_ALLOW_PRIVATE_TARGETS"])
    if problem:
        raise ApiError(422, problem)
    return url


def _event_types(payload):
    event_types = payload["event_types"]
    if not isinstance(event_types, list) or not event_types or not all(
            isinstance(p, str) and 0 < len(p) <= 200 for p in event_types):
        raise ApiError(400, "event_types must be a non-empty list of type names or patterns like 'file.*'")
    return event_types


def _event_versions(payload):
    event_versions = payload["event_versions"]
    if not isinstance(event_versions, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
            for k, v in event_versions.items()):
        raise ApiError(400, 'event_versions must map event types to whole versions, like {"file.updated": 2}')
    return event_versions


def _one_of(name, allowed):
    def check(payload):
        if payload[name] not in allowed:
            raise ApiError(400, f"{name} must be one of: {', '.join(allowed)}")
        return payload[name]
    return check


def _description(payload):
    description = payload["description"]
    if not isinstance(description, str) or len(description) > 500:
        raise ApiError(400, "description must be a string of at most 500 characters")
    return description


def _rate_limit(payload):
    value = payload["rate_limit_per_s"]
    return None if value is None else float(_number(payload, "rate_limit_per_s", 0.01, MAX_RATE_LIMIT_PER_S, None))


def _max_in_flight(payload):
    value = payload["max_in_flight"]
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 1 <= value <= MAX_IN_FLIGHT):
        raise ApiError(400, f"max_in_flight must be a whole number from 1 to {MAX_IN_FLIGHT}, or null")
    return value


_CHECKS = {
    "url": (None, _url),
    "event_types": (["*"], _event_types),
    "event_versions": ({}, _event_versions),
    "retry_policy": ("exponential", _one_of("retry_policy", POLICY_NAMES)),
    "signature_scheme": ("promesa", _one_of("signature_scheme", SCHEMES)),
    "description": ("", _description),
    "connect_timeout": (5, lambda p: _number(p, "connect_timeout", 0.1, 5, None)),
    "attempt_timeout": (10, lambda p: _number(p, "attempt_timeout", 0.1, 10, None)),
    "max_age_seconds": (86400, lambda p: int(_number(p, "max_age_seconds", 60, 7 * 86400, None))),
    "rate_limit_per_s": (None, _rate_limit),
    "max_in_flight": (None, _max_in_flight),
}


def validated(payload, allowed: set[str], required: set[str] = frozenset(), defaults: bool = True) -> dict:
    """The checked values of a create (every field, defaults filled in) or an edit (only the fields
    given): one set of rules for both. Raises ApiError before anything is stored."""
    check_fields(payload, allowed, required)
    out = {}
    for name, (default, check) in _CHECKS.items():
        if name in payload:
            out[name] = check(payload)
        elif defaults:
            out[name] = default
    return out


def create(team: Team, payload) -> tuple[Subscription, str]:
    """Validate everything first, store once: nothing half-way. Returns the subscription and its secret."""
    values = validated(payload, FIELDS, {"url"})
    secret = signing.new_secret()
    sub = Subscription(team_id=team.id, secret_ciphertext=crypto.encrypt(secret), state=SubscriptionState.ACTIVE,
                       **values)
    db.session.add(sub)
    db.session.flush()  # its id, for the audit entry
    audit.record("subscription.created", subscription=sub, detail={"url": sub.url})
    db.session.commit()
    return sub, secret


def not_deleted(sub: Subscription) -> Subscription:
    if sub.deleted_at is not None:
        raise ApiError(409, "this subscription is deleted: its history stays readable, nothing else changes")
    return sub


def edit(sub: Subscription, payload) -> dict:
    """Change what the owner may change; the audit log keeps before and after of each changed field
    (secrets are not fields here: they change by rotation only). Returns {field: (before, after)}."""
    not_deleted(sub)
    if isinstance(payload, dict) and "signature_scheme" in payload:
        raise ApiError(400, "signature_scheme cannot be changed: receivers verify by it; create a new subscription")
    values = validated(payload, EDITABLE, defaults=False)
    changed = {name: (getattr(sub, name), value) for name, value in values.items() if getattr(sub, name) != value}
    if changed:
        for name, (_, value) in changed.items():
            setattr(sub, name, value)
        sub.updated_at = current_app.config["CLOCK"].now()
        audit.record("subscription.edited", subscription=sub, detail={
            "before": {k: before for k, (before, _) in changed.items()},
            "after": {k: after for k, (_, after) in changed.items()}})
        db.session.commit()
    return changed


def delete(sub: Subscription) -> int:
    """Soft delete: out of routing and the API's list, nothing more attempted, history kept.
    Waiting deliveries (in flight ones too: their lease is taken back) end cancelled. Returns how many."""
    not_deleted(sub)
    now = current_app.config["CLOCK"].now()
    sub.deleted_at = now
    # Disabled too: anything that still reaches a worker (an ingest racing this) is held, never sent.
    sub.state = SubscriptionState.DISABLED
    sub.state_reason = "deleted"
    sub.previous_secret_ciphertext = sub.previous_secret_expires_at = None
    cancelled = cancel_waiting([sub.id], now)
    audit.record("subscription.deleted", subscription=sub, deliveries=cancelled, detail={"url": sub.url})
    db.session.commit()
    return cancelled


def cancel_waiting(subscription_ids: list[str], now) -> int:
    """Waiting deliveries of these subscriptions end cancelled. Clearing the lease makes a worker's
    record of an attempt already in flight leave the state alone (it settles by lease token)."""
    return db.session.execute(
        update(Delivery).where(Delivery.subscription_id.in_(subscription_ids),
                               Delivery.state.in_(DeliveryState.WAITING))
        .values(state=DeliveryState.CANCELLED, next_attempt_at=None, updated_at=now,
                lease_token=None, lease_expires_at=None)).rowcount


def pause(sub: Subscription, reason: str = "paused by an operator") -> int:
    """Deliveries keep accumulating (held); nothing is dropped. Returns how many waiting ones were held."""
    not_deleted(sub)
    now = current_app.config["CLOCK"].now()
    sub.state = SubscriptionState.PAUSED
    sub.state_reason = reason
    # Waiting deliveries show as held at once; one already in flight finishes, and is held if it fails.
    held = db.session.execute(
        update(Delivery).where(Delivery.subscription_id == sub.id, Delivery.state.in_(DeliveryState.DUE),
                               or_(Delivery.lease_expires_at.is_(None), Delivery.lease_expires_at < now))
        .values(state=DeliveryState.HELD, updated_at=now)).rowcount
    audit.record("subscription.paused", subscription=sub, deliveries=held, detail={"reason": reason})
    db.session.commit()
    return held


def resume(sub: Subscription) -> int:
    """Active again: every held delivery becomes due now. Returns how many were released."""
    not_deleted(sub)
    now = current_app.config["CLOCK"].now()
    sub.state = SubscriptionState.ACTIVE
    sub.state_reason = None
    ids = db.session.scalars(
        update(Delivery).where(Delivery.subscription_id == sub.id, Delivery.state == DeliveryState.HELD)
        .values(state=DeliveryState.PENDING, next_attempt_at=now, updated_at=now)
        .returning(Delivery.id)).all()
    audit.record("subscription.resumed", subscription=sub, deliveries=len(ids))
    db.session.commit()
    enqueue([work_item(sub.id, i) for i in ids])
    return len(ids)


TEST_EVENT_TYPE = "promesa.test"


def send_test_event(sub: Subscription) -> tuple[str, str]:
    """A `promesa.test` event to this one endpoint through the real pipeline, whatever its type filter
    and the team's strict catalog say. Returns (event id, delivery id)."""
    not_deleted(sub)
    if sub.state != SubscriptionState.ACTIVE:
        raise ApiError(409, f"this subscription is {sub.state}: a test event would be held; resume it first")
    event_id = new_ids("evt", 1)[0]
    # Recorded first: ingest's commit writes it with the event, and a refused event leaves no entry.
    audit.record("subscription.test_sent", subscription=sub, detail={"event_id": event_id})
    ingest_many(sub.team, [{"id": event_id, "type": TEST_EVENT_TYPE,
                            "data": {"subscription_id": sub.id, "test": True}}],
                numbered=False, only=(sub.id, True))
    return event_id, db.session.scalar(select(Delivery.id).where(Delivery.event_id == event_id))


# Named deliveries may be re-sent whether they died or succeeded (a receiver that lost its data);
# "replay all" means the dead letters.
RESENDABLE = (DeliveryState.DEAD, DeliveryState.SUCCEEDED)


def replay(sub: Subscription, delivery_ids: list[str] | None = None) -> int:
    """Send again, with a fresh retry schedule; the event id and body stay the same."""
    not_deleted(sub)
    states = RESENDABLE if delivery_ids is not None else (DeliveryState.DEAD,)
    now = current_app.config["CLOCK"].now()
    target = DeliveryState.PENDING if sub.state == SubscriptionState.ACTIVE else DeliveryState.HELD
    query = update(Delivery).where(Delivery.subscription_id == sub.id, Delivery.state.in_(states))
    if delivery_ids is not None:
        query = query.where(Delivery.id.in_(delivery_ids))
    ids = db.session.scalars(
        query.values(state=target, next_attempt_at=now, updated_at=now, retry_base=Delivery.attempt_count,
                     schedule_started_at=now,
                     dead_lettered_at=None, succeeded_at=None, lease_token=None, lease_expires_at=None)
        .returning(Delivery.id)).all()
    audit.record("deliveries.replayed", subscription=sub, deliveries=len(ids),
                 detail={"delivery_ids": delivery_ids[:20]} if delivery_ids else {"which": "all dead letters"})
    db.session.commit()
    if target == DeliveryState.PENDING:
        enqueue([work_item(sub.id, i) for i in ids])
    return len(ids)


def deliveries_page(sub: Subscription, state: str | None, before: str | None,
                    limit: int) -> tuple[list[Delivery], str | None]:
    """Newest first, optionally in one state; `before` is the previous page's next_before (ids are time-ordered)."""
    query = select(Delivery).where(Delivery.subscription_id == sub.id)
    if state:
        query = query.where(Delivery.state == state)
    if before:
        query = query.where(Delivery.id < before)
    rows = db.session.scalars(query.order_by(Delivery.id.desc()).limit(limit + 1)).all()
    page = rows[:limit]
    return page, page[-1].id if len(rows) > limit else None


def for_team(team: Team, subscription_id: str) -> Subscription | None:
    """The team's subscription, deleted or not (a deleted one's history stays readable)."""
    return db.session.scalar(select(Subscription).where(Subscription.id == subscription_id,
                                                        Subscription.team_id == team.id))


def describe(sub: Subscription) -> dict:
    return {"id": sub.id, "url": sub.url, "description": sub.description, "event_types": sub.event_types,
            "event_versions": sub.event_versions or {},
            "retry_policy": sub.retry_policy, "signature_scheme": sub.signature_scheme, "state": sub.state,
            "state_reason": sub.state_reason, "connect_timeout": sub.connect_timeout,
            "attempt_timeout": sub.attempt_timeout, "max_age_seconds": sub.max_age_seconds,
            "rate_limit_per_s": sub.rate_limit_per_s, "max_in_flight": sub.max_in_flight,
            "signing_secrets": rotation.signing_json(sub, current_app.config["CLOCK"].now()),
            "created_at": iso(sub.created_at), "deleted_at": iso(sub.deleted_at)}
