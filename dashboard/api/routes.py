"""The producer API's routes. Each is declared with `@operation` (see `operations.py`), which
validates its input with the models in `dashboard/schemas.py` and documents it in the OpenAPI document."""

from __future__ import annotations

from flask import current_app, g, jsonify, request

from .. import audit, catalog
from .. import contract as contract_service
from .. import ingest as ingest_service
from .. import rotation
from .. import subscriptions as subscription_service
from ..clock import iso
from ..extensions import db
from ..models import Attempt, Delivery, DeliveryState
from ..validation import NO_NUL, ApiError
from .. import schemas
from . import bp
from .openapi import document
from .operations import operation

IDEMPOTENCY_KEY = {"name": "Idempotency-Key", "in": "header", "required": False,
                   "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": NO_NUL},
                   "description": "a repeated key returns the first event instead of a second"}


def subscription_or_404(subscription_id):
    sub = subscription_service.for_team(g.team, subscription_id)
    if sub is None:
        raise ApiError(404, f"no subscription {subscription_id!r} in your team")
    return sub


def attempt_json(a: Attempt) -> dict:
    return {"number": a.number, "attempted_at": iso(a.attempted_at), "duration_ms": a.duration_ms,
            "status_code": a.status_code, "error": a.error, "response_excerpt": a.response_excerpt}


def delivery_json(d: Delivery, event_id: str, with_attempts=False) -> dict:
    """`event_id`: the producer-facing id of the delivery's event (the delivery holds only its key)."""
    out = {"id": d.id, "event_id": event_id, "subscription_id": d.subscription_id, "state": d.state,
           "attempt_count": d.attempt_count, "next_attempt_at": iso(d.next_attempt_at)
           if d.state == DeliveryState.SCHEDULED else None,
           "last_status_code": d.last_status_code, "last_error": d.last_error, "created_at": iso(d.created_at),
           "succeeded_at": iso(d.succeeded_at), "dead_lettered_at": iso(d.dead_lettered_at)}
    if with_attempts:
        out["attempts"] = [attempt_json(a) for a in d.attempts]
    return out


@bp.get("/openapi.json")
@operation("This document (OpenAPI 3.1)", responses={200: schemas.OpenApiDocument}, public=True)
def openapi():
    return jsonify(document(current_app))


@bp.post("/events")
@operation("Accept an event for delivery", body=schemas.EventInput, headers=(IDEMPOTENCY_KEY,),
           responses={202: schemas.Accepted}, errors=(409, 422), links_to="event_id", token_read_by_view=True)
def create_event(body: schemas.EventInput):
    # The token is checked by the statement that reads the event's routing: one round trip fewer per event.
    accepted = ingest_service.ingest(ingest_service.BearerToken(g.bearer_digest), body, request.headers.get("Idempotency-Key"))
    return jsonify(id=accepted.id, deliveries=accepted.deliveries, duplicate=accepted.duplicate), 202


@bp.post("/events/batch")
@operation("Accept up to 500 events in one request and one transaction; one bad event rejects the batch "
           "(the error names its index) and nothing is stored", body=schemas.EventBatch,
           responses={202: schemas.AcceptedBatch}, errors=(409, 422))
def create_events(body: schemas.EventBatch):
    """Many events in one request and one transaction: for producers with a lot to say."""
    if "Idempotency-Key" in request.headers:
        raise ApiError(400, "Idempotency-Key applies to single events; give each event of a batch its own id")
    accepted = ingest_service.ingest_many(g.team, body.events)
    return jsonify(data=[{"id": a.id, "deliveries": a.deliveries, "duplicate": a.duplicate}
                         for a in accepted]), 202


@bp.get("/events/<event_id>")
@operation("An event with its deliveries and their attempts", responses={200: schemas.Event})
def get_event(event_id):
    event = ingest_service.for_team(g.team, event_id)
    if event is None:
        raise ApiError(404, f"no event {event_id!r} in your team")
    deliveries = [delivery_json(d, event.id, with_attempts=True) for d in event.deliveries]
    return jsonify(id=event.id, type=event.type, version=event.version, timestamp=iso(event.occurred_at),
                   data=event.data, deliveries=deliveries)


@bp.post("/subscriptions")
@operation("Create a subscription; its signing secret is shown in this answer only",
           body=schemas.SubscriptionInput, responses={201: schemas.SubscriptionWithSecret}, errors=(422,),
           links_to="subscription_id")
def create_subscription(body: schemas.SubscriptionInput):
    sub, secret = subscription_service.create(g.team, body)
    return jsonify(subscription_service.describe(sub) | {"secret": secret}), 201


@bp.get("/subscriptions")
@operation("The team's subscriptions", responses={200: schemas.SubscriptionList})
def list_subscriptions():
    subs = [s for s in g.team.subscriptions if s.deleted_at is None]  # deleted ones open by id only
    return jsonify(data=[subscription_service.describe(s) for s in subs])


@bp.get("/subscriptions/<subscription_id>")
@operation("One subscription", responses={200: schemas.Subscription})
def get_subscription(subscription_id):
    return jsonify(subscription_service.describe(subscription_or_404(subscription_id)))


@bp.patch("/subscriptions/<subscription_id>")
@operation("Edit: url (checked as at creation), event types and versions, retry policy, timeouts, description, "
           "rate limit, in-flight cap; only the fields given change, and the audit log keeps before and after. "
           "The signature scheme cannot change", body=schemas.SubscriptionEdit,
           responses={200: schemas.Subscription}, errors=(409, 422))
def edit_subscription(subscription_id, body: schemas.SubscriptionEdit):
    sub = subscription_or_404(subscription_id)
    subscription_service.edit(sub, body)
    return jsonify(subscription_service.describe(sub))


@bp.delete("/subscriptions/<subscription_id>")
@operation("Delete: nothing more is attempted, waiting deliveries end cancelled, the history stays readable",
           responses={200: schemas.Deleted}, errors=(409,))
def delete_subscription(subscription_id):
    sub = subscription_or_404(subscription_id)
    cancelled = subscription_service.delete(sub)
    return jsonify(subscription_service.describe(sub) | {"cancelled": cancelled})


@bp.post("/subscriptions/<subscription_id>/rotate-secret")
@operation("Rotate the signing secret; the new one is shown in this answer only. During the grace both sign "
           "every delivery (X-Signature: t=…,v1=<new>,v1=<old>; Standard Webhooks: v1,<new> v1,<old>); at most "
           "two secrets sign", body=schemas.RotateInput, body_required=False,
           responses={200: schemas.SubscriptionWithSecret}, errors=(409,))
def rotate_secret(subscription_id, body: schemas.RotateInput):
    sub = subscription_or_404(subscription_id)
    secret = rotation.rotate(sub, body.grace_seconds)
    return jsonify(subscription_service.describe(sub) | {"secret": secret})


@bp.post("/subscriptions/<subscription_id>/end-grace")
@operation("End a rotation's grace now: only the newest secret signs; the previous one is deleted",
           responses={200: schemas.Subscription}, errors=(409,))
def end_grace(subscription_id):
    sub = subscription_or_404(subscription_id)
    subscription_service.not_deleted(sub)
    rotation.end_grace(sub)
    return jsonify(subscription_service.describe(sub))


@bp.post("/subscriptions/<subscription_id>/test")
@operation("Send a promesa.test event to this endpoint alone, through the real pipeline (whatever its type "
           "filter and the catalog's strict mode say)", responses={202: schemas.TestSent}, errors=(409,))
def send_test_event(subscription_id):
    event_id, delivery_id = subscription_service.send_test_event(subscription_or_404(subscription_id))
    return jsonify(event_id=event_id, delivery_id=delivery_id), 202


@bp.get("/subscriptions/<subscription_id>/contract")
@operation("The subscription's published contract, generated from its live configuration",
           responses={200: schemas.Contract})
def subscription_contract(subscription_id):
    return jsonify(contract_service.as_json(contract_service.build(subscription_or_404(subscription_id))))


@bp.post("/subscriptions/<subscription_id>/pause")
@operation("Pause: deliveries are held, nothing is dropped", responses={200: schemas.Subscription}, errors=(409,))
def pause_subscription(subscription_id):
    sub = subscription_or_404(subscription_id)
    subscription_service.pause(sub)
    return jsonify(subscription_service.describe(sub))


@bp.post("/subscriptions/<subscription_id>/resume")
@operation("Resume: held deliveries are sent", responses={200: schemas.Resumed}, errors=(409,))
def resume_subscription(subscription_id):
    sub = subscription_or_404(subscription_id)
    released = subscription_service.resume(sub)
    return jsonify(subscription_service.describe(sub) | {"released": released})


@bp.post("/subscriptions/<subscription_id>/replay")
@operation("Replay every dead letter, or re-send the given dead or succeeded deliveries, with a fresh "
           "retry schedule", body=schemas.ReplayInput, body_required=False, responses={202: schemas.Replayed}, errors=(409,))
def replay_subscription(subscription_id, body: schemas.ReplayInput):
    """Replays the subscription's dead letters, or re-sends the given dead or succeeded deliveries."""
    sub = subscription_or_404(subscription_id)
    return jsonify(replayed=subscription_service.replay(sub, delivery_ids=body.delivery_ids)), 202


@bp.get("/subscriptions/<subscription_id>/deliveries")
@operation("The subscription's deliveries, newest first", query=schemas.DeliveriesQuery,
           responses={200: schemas.DeliveryPage})
def list_deliveries(subscription_id, query: schemas.DeliveriesQuery):
    sub = subscription_or_404(subscription_id)
    page, next_before = subscription_service.deliveries_page(sub, query.state, query.before, query.limit)
    return jsonify(data=[delivery_json(d, d.event.id) for d in page], next_before=next_before)


@bp.post("/event-types")
@operation("Declare an event type version with a JSON Schema for its data", body=schemas.EventTypeInput,
           responses={201: schemas.EventType}, errors=(409, 422))
def declare_event_type(body: schemas.EventTypeInput):
    return jsonify(catalog.describe(catalog.declare(g.team, body))), 201


@bp.get("/event-types")
@operation("The team's event-type catalog", responses={200: schemas.EventTypeList})
def list_event_types():
    return jsonify(data=[catalog.describe(t) for t in catalog.for_team(g.team)])


def team_json(team) -> dict:
    return {"name": team.name, "strict_event_types": team.strict_event_types}


@bp.get("/team")
@operation("The team's settings", responses={200: schemas.Team})
def get_team():
    return jsonify(team_json(g.team))


@bp.patch("/team")
@operation("Change the team's settings (strict mode: only declared event types)", body=schemas.TeamUpdate,
           responses={200: schemas.Team})
def update_team(body: schemas.TeamUpdate):
    if body.strict_event_types is not None and body.strict_event_types != g.team.strict_event_types:
        g.team.strict_event_types = body.strict_event_types
        audit.record("team.updated", team_id=g.team.id, detail={"strict_event_types": body.strict_event_types})
        db.session.commit()
    return jsonify(team_json(g.team))
