"""The API's answers: one function per JSON shape, each the shape its model in `dashboard/schemas.py` documents."""

from __future__ import annotations

from flask import current_app

from dashboard.core.clock import iso
from dashboard.core.links import absolute
from dashboard.models import (
    Attempt,
    Check,
    Consumer,
    Delivery,
    DeliveryState,
    Event,
    EventType,
    Incident,
    Replay,
    Subscription,
    Team,
)
from dashboard.ingest import quotas
from dashboard.operations import incidents as incident_service
from dashboard.operations import replays as replay_service
from dashboard.operations.incident_rules import title
from dashboard.subscriptions import client_auth, client_tls, own_headers, rotation


def signing_secrets(sub: Subscription, now) -> list[dict]:
    return [{"which": s.which, "until": iso(s.until)} for s in rotation.signing_secrets(sub, now)]


def subscription(sub: Subscription) -> dict:
    return {"id": sub.id, "url": sub.url, "mode": sub.mode, "pull_key_prefix": sub.pull_key_prefix,
            "listen": sub.listen, "listen_seen_at": iso(sub.listen_seen_at), "description": sub.description,
            "event_types": sub.event_types, "event_versions": sub.event_versions or {},
            "retry_policy": sub.retry_policy, "signature_scheme": sub.signature_scheme, "state": sub.state,
            "state_reason": sub.state_reason, "connect_timeout": sub.connect_timeout,
            "attempt_timeout": sub.attempt_timeout, "max_age_seconds": sub.max_age_seconds,
            "rate_limit_per_s": sub.rate_limit_per_s, "max_in_flight": sub.max_in_flight,
            "signing_secrets": signing_secrets(sub, current_app.config["CLOCK"].now()),
            "headers": own_headers.masked_of(sub), "auth": client_auth.masked_of(sub),
            "consumer": sub.consumer.uid if sub.consumer_id is not None else None, "filter": sub.filter,
            "tls": client_tls.view_of(sub), "created_at": iso(sub.created_at), "deleted_at": iso(sub.deleted_at)}


def consumer(c: Consumer, subscriptions: int) -> dict:
    return {"uid": c.uid, "name": c.name, "metadata": c.meta, "state": c.state, "subscriptions": subscriptions,
            "created_at": iso(c.created_at), "updated_at": iso(c.updated_at), "deleted_at": iso(c.deleted_at)}


def event_type(declared: EventType) -> dict:
    return {"name": declared.name, "version": declared.version, "description": declared.description,
            "schema": declared.schema, "created_at": iso(declared.created_at)}


def contract(built: dict) -> dict:
    """A subscription's contract (`dashboard.subscriptions.contract.build`): everything but the ORM objects."""
    out = {k: v for k, v in built.items() if k not in {"subscription", "declared", "generated_at"}}
    out["status"] = [{"status": s, "handling": h} for s, h in built["status"]]
    out["declared"] = [event_type(t) for t in built["declared"]]
    out["generated_at"] = built["generated_at"].isoformat() + "Z"
    return out


def accepted(a) -> dict:
    """An accepted event (`dashboard.ingest.accept.Accepted`)."""
    return {"id": a.id, "deliveries": a.deliveries, "duplicate": a.duplicate}


def attempt(a: Attempt) -> dict:
    return {"number": a.number, "attempted_at": iso(a.attempted_at), "duration_ms": a.duration_ms,
            "status_code": a.status_code, "error": a.error, "response_excerpt": a.response_excerpt}


def delivery(d: Delivery, event_id: str, with_attempts=False) -> dict:
    """`event_id`: the producer-facing id of the delivery's event (the delivery holds only its key)."""
    out = {"id": d.id, "event_id": event_id, "subscription_id": d.subscription_id, "state": d.state,
           "attempt_count": d.attempt_count, "next_attempt_at": iso(d.next_attempt_at)
           if d.state == DeliveryState.SCHEDULED else None,
           "last_status_code": d.last_status_code, "last_error": d.last_error, "created_at": iso(d.created_at),
           "succeeded_at": iso(d.succeeded_at), "dead_lettered_at": iso(d.dead_lettered_at)}
    if with_attempts:
        out["attempts"] = [attempt(a) for a in d.attempts]
    return out


def event(e: Event) -> dict:
    """An event with its deliveries and their attempts."""
    return {"id": e.id, "type": e.type, "version": e.version, "timestamp": iso(e.occurred_at), "data": e.data,
            "consumer": e.consumer.uid if e.consumer_id is not None else None,
            "deliveries": [delivery(d, e.id, with_attempts=True) for d in e.deliveries]}


def replay(r: Replay) -> dict:
    """A bulk replay, its outcomes counted live."""
    live = replay_service.outcomes(r.id)
    return {"id": r.id, "kind": r.kind, "state": r.state, "progress": replay_service.progress_word(r, live),
            "filter": r.filter, "subscription_id": r.subscription_id,
            "total": r.total, "done": r.done, **live, "error": r.error,
            "created_by": r.actor, "created_at": iso(r.created_at), "started_at": iso(r.started_at),
            "finished_at": iso(r.finished_at)}


def replay_started(r: Replay, started: bool) -> dict:
    """A bulk replay as `start` answers: `duplicate` when the same filter was already queued or running."""
    return {"id": r.id, "total": r.total, "state": r.state, "duplicate": not started}


def incident(i: Incident) -> dict:
    """An incident as its page tells it: what fired, in words, who is on it, and the link to the page."""
    return {"id": i.id, "subscription_id": i.subscription_id, "consumer": incident_service.consumer_uid(i),
            "state": i.state, "title": title(i.rule),
            "rules": [i.rule, *(r for r in incident_service.rules_of(i) if r != i.rule)],
            "figures": incident_service.describe_figures(i), "opened_at": iso(i.opened_at),
            "first_seen_at": iso(i.first_seen_at), "acknowledged_at": iso(i.acknowledged_at),
            "acknowledged_by": i.acknowledged_by, "note": i.acknowledged_note, "snoozed_until": iso(i.snoozed_until),
            "resolved_at": iso(i.resolved_at), "resolved_by": i.resolved_by,
            "url": absolute(f"/incidents/{i.id}")}


def team(t: Team) -> dict:
    return {"name": t.name, "strict_event_types": t.strict_event_types, "quotas": quotas.describe(t)}


def check(check: Check) -> dict:
    """A receiver check: its state and, once finished, one result per rule."""
    return {"id": check.id, "subscription_id": check.subscription_id, "state": check.state,
            "started_at": iso(check.started_at), "finished_at": iso(check.finished_at),
            "results": check.results or [], "requested_by": check.requested_by, "error": check.error}
