from __future__ import annotations

import functools

from flask import g, jsonify, request
from sqlalchemy import bindparam, select

from .. import catalog
from .. import contract as contract_service
from .. import ingest as ingest_service
from .. import rotation
from .. import subscriptions as subscription_service
from ..clock import iso
from ..extensions import db
from ..models import ApiToken, Attempt, Delivery, DeliveryState, Event, Team
from ..validation import ApiError, check_fields
from . import bp
from .openapi import document

PAGE_LIMIT = 100


# Built once: every API request runs it (the revoked check stays in the query, so revoking takes effect at once).
_TEAM_BY_TOKEN = (select(Team, ApiToken.display_prefix).join(ApiToken, ApiToken.team_id == Team.id)
                  .where(ApiToken.token_sha256 == bindparam("digest"), ApiToken.revoked_at.is_(None)))


def token_required(view):
    @functools.wraps(view)
    def wrapped(*args, **kwargs):
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "missing bearer token: send 'Authorization: Bearer <team token>'")
        found = db.session.execute(_TEAM_BY_TOKEN, {"digest": ApiToken.digest(token.strip())}).first()
        if found is None:
            raise ApiError(401, "invalid or revoked token")
        g.team, g.api_token_prefix = found  # the prefix names the actor in the audit log
        return view(*args, **kwargs)

    return wrapped


def json_body():
    if not request.is_json:
        raise ApiError(415, "send the body as JSON with 'Content-Type: application/json'")
    payload = request.get_json(silent=True)
    if payload is None:
        raise ApiError(400, "the body is not valid JSON")
    return payload


def subscription_or_404(subscription_id):
    sub = subscription_service.for_team(g.team, subscription_id)
    if sub is None:
        raise ApiError(404, f"no subscription {subscription_id!r} in your team")
    return sub


def attempt_json(a: Attempt) -> dict:
    return {"number": a.number, "attempted_at": iso(a.attempted_at), "duration_ms": a.duration_ms,
            "status_code": a.status_code, "error": a.error, "response_excerpt": a.response_excerpt}


def delivery_json(d: Delivery, with_attempts=False) -> dict:
    out = {"id": d.id, "event_id": d.event_id, "subscription_id": d.subscription_id, "state": d.state,
           "attempt_count": d.attempt_count, "next_attempt_at": iso(d.next_attempt_at)
           if d.state == DeliveryState.SCHEDULED else None,
           "last_status_code": d.last_status_code, "last_error": d.last_error, "created_at": iso(d.created_at),
           "succeeded_at": iso(d.succeeded_at), "dead_lettered_at": iso(d.dead_lettered_at)}
    if with_attempts:
        out["attempts"] = [attempt_json(a) for a in d.attempts]
    return out


@bp.get("/openapi.json")
def openapi():
    return jsonify(document())


@bp.post("/events")
@token_required
def create_event():
    accepted = ingest_service.ingest(g.team, json_body(), request.headers.get("Idempotency-Key"))
    return jsonify(id=accepted.id, deliveries=accepted.deliveries, duplicate=accepted.duplicate), 202


@bp.post("/events/batch")
@token_required
def create_events():
    """Many events in one request and one transaction: for producers with a lot to say."""
    payload = check_fields(json_body(), {"events"}, {"events"})
    events = payload["events"]
    if not isinstance(events, list) or not 1 <= len(events) <= ingest_service.MAX_BATCH:
        raise ApiError(400, f"events must be a list of 1 to {ingest_service.MAX_BATCH} events")
    if "Idempotency-Key" in request.headers:
        raise ApiError(400, "Idempotency-Key applies to single events; give each event of a batch its own id")
    accepted = ingest_service.ingest_many(g.team, events)
    return jsonify(data=[{"id": a.id, "deliveries": a.deliveries, "duplicate": a.duplicate}
                         for a in accepted]), 202


@bp.get("/events/<event_id>")
@token_required
def get_event(event_id):
    event = db.session.get(Event, event_id)
    if event is None or event.team_id != g.team.id:
        raise ApiError(404, f"no event {event_id!r} in your team")
    return jsonify(id=event.id, type=event.type, version=event.version, timestamp=iso(event.occurred_at),
                   data=event.data, deliveries=[delivery_json(d, with_attempts=True) for d in event.deliveries])


@bp.post("/subscriptions")
@token_required
def create_subscription():
    sub, secret = subscription_service.create(g.team, json_body())
    return jsonify(subscription_service.describe(sub) | {"secret": secret}), 201


@bp.get("/subscriptions")
@token_required
def list_subscriptions():
    subs = [s for s in g.team.subscriptions if s.deleted_at is None]  # deleted ones open by id only
    return jsonify(data=[subscription_service.describe(s) for s in subs])


@bp.get("/subscriptions/<subscription_id>")
@token_required
def get_subscription(subscription_id):
    return jsonify(subscription_service.describe(subscription_or_404(subscription_id)))


@bp.patch("/subscriptions/<subscription_id>")
@token_required
def edit_subscription(subscription_id):
    """Change url, event types and versions, retry policy, timeouts, description, rate limit, in-flight cap."""
    sub = subscription_or_404(subscription_id)
    subscription_service.edit(sub, json_body())
    return jsonify(subscription_service.describe(sub))


@bp.delete("/subscriptions/<subscription_id>")
@token_required
def delete_subscription(subscription_id):
    """Soft delete: nothing more is attempted; waiting deliveries end cancelled; history stays readable."""
    sub = subscription_or_404(subscription_id)
    cancelled = subscription_service.delete(sub)
    return jsonify(subscription_service.describe(sub) | {"cancelled": cancelled})


@bp.post("/subscriptions/<subscription_id>/rotate-secret")
@token_required
def rotate_secret(subscription_id):
    sub = subscription_or_404(subscription_id)
    grace = rotation.grace_from(json_body() if request.content_length else {})
    secret = rotation.rotate(sub, grace)
    return jsonify(subscription_service.describe(sub) | {"secret": secret})


@bp.post("/subscriptions/<subscription_id>/end-grace")
@token_required
def end_grace(subscription_id):
    sub = subscription_or_404(subscription_id)
    subscription_service.not_deleted(sub)
    rotation.end_grace(sub)
    return jsonify(subscription_service.describe(sub))


@bp.post("/subscriptions/<subscription_id>/test")
@token_required
def send_test_event(subscription_id):
    event_id, delivery_id = subscription_service.send_test_event(subscription_or_404(subscription_id))
    return jsonify(event_id=event_id, delivery_id=delivery_id), 202


@bp.get("/subscriptions/<subscription_id>/contract")
@token_required
def subscription_contract(subscription_id):
    return jsonify(contract_service.as_json(contract_service.build(subscription_or_404(subscription_id))))


@bp.post("/subscriptions/<subscription_id>/pause")
@token_required
def pause_subscription(subscription_id):
    sub = subscription_or_404(subscription_id)
    subscription_service.pause(sub)
    return jsonify(subscription_service.describe(sub))


@bp.post("/subscriptions/<subscription_id>/resume")
@token_required
def resume_subscription(subscription_id):
    sub = subscription_or_404(subscription_id)
    released = subscription_service.resume(sub)
    return jsonify(subscription_service.describe(sub) | {"released": released})


@bp.post("/subscriptions/<subscription_id>/replay")
@token_required
def replay_subscription(subscription_id):
    """Replays the subscription's dead letters, or re-sends the given dead or succeeded deliveries."""
    sub = subscription_or_404(subscription_id)
    payload = json_body() if request.content_length else {}
    check_fields(payload, {"delivery_ids"})
    ids = payload.get("delivery_ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
        raise ApiError(400, "delivery_ids must be a list of delivery ids")
    return jsonify(replayed=subscription_service.replay(sub, delivery_ids=ids)), 202


@bp.post("/event-types")
@token_required
def declare_event_type():
    return jsonify(catalog.describe(catalog.declare(g.team, json_body()))), 201


@bp.get("/event-types")
@token_required
def list_event_types():
    return jsonify(data=[catalog.describe(t) for t in catalog.for_team(g.team)])


def team_json(team) -> dict:
    return {"name": team.name, "strict_event_types": team.strict_event_types}


@bp.get("/team")
@token_required
def get_team():
    return jsonify(team_json(g.team))


@bp.patch("/team")
@token_required
def update_team():
    payload = check_fields(json_body(), {"strict_event_types"})
    strict = payload.get("strict_event_types", g.team.strict_event_types)
    if not isinstance(strict, bool):
        raise ApiError(400, "strict_event_types must be true or false")
    g.team.strict_event_types = strict
    db.session.commit()
    return jsonify(team_json(g.team))


@bp.get("/subscriptions/<subscription_id>/deliveries")
@token_required
def list_deliveries(subscription_id):
    sub = subscription_or_404(subscription_id)
    state = request.args.get("state")
    if state is not None and state not in DeliveryState.ALL:
        raise ApiError(400, f"state must be one of: {', '.join(DeliveryState.ALL)}")
    try:
        limit = int(request.args.get("limit", 50))
    except ValueError:
        raise ApiError(400, "limit must be a whole number") from None
    if not 1 <= limit <= PAGE_LIMIT:
        raise ApiError(400, f"limit must be from 1 to {PAGE_LIMIT}")
    page, next_before = subscription_service.deliveries_page(sub, state, request.args.get("before"), limit)
    return jsonify(data=[delivery_json(d) for d in page], next_before=next_before)
