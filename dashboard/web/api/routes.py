"""The producer API's routes. Each is declared with `@operation` (see `operations.py`), which
validates its input with the models in `dashboard/schemas.py` and documents it in the OpenAPI document."""

from __future__ import annotations

from flask import current_app, g, jsonify, request
from sqlalchemy import select

from dashboard import audit, schemas
from dashboard.core import filters, paging, tracing
from dashboard.core.extensions import db
from dashboard.core.validation import NO_NUL, ApiError, refuse_reserved
from dashboard.ingest import accept as ingest_service
from dashboard.ingest import catalog
from dashboard.models import Subscription
from dashboard.subscriptions import checks as check_service
from dashboard.subscriptions import contract as contract_service
from dashboard.subscriptions import rotation
from dashboard.subscriptions import service as subscription_service
from dashboard.web.api import bp, shapes
from dashboard.web.api.openapi import document
from dashboard.web.api.operations import operation

TRACEPARENT = {"name": "traceparent", "in": "header", "required": False, "schema": {"type": "string"},
               "description": "W3C Trace Context: stored with the event and sent on every delivery attempt, so the "
                              "receiver's trace joins yours; an invalid one is ignored"}
IDEMPOTENCY_KEY = {"name": "Idempotency-Key", "in": "header", "required": False,
                   "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": NO_NUL},
                   "description": "a repeated key returns the first event instead of a second"}


@bp.get("/openapi.json")
@operation("This document (OpenAPI 3.1)", responses={200: schemas.OpenApiDocument}, public=True)
def openapi():
    return jsonify(document(current_app))


@bp.post("/events")
@operation("Accept an event for delivery", body=schemas.EventInput, headers=(IDEMPOTENCY_KEY, TRACEPARENT),
           responses={202: schemas.Accepted}, errors=(409, 422, 429), links_to="event_id", token_read_by_view=True)
def create_event(body: schemas.EventInput):
    refuse_reserved(body.type, "type")
    traceparent = tracing.traceparent(request.headers.get(tracing.HEADER))
    with ingest_span("/api/v1/events", traceparent) as span:
        # The token is checked by the statement that reads the event's routing: one round trip fewer per event.
        accepted = ingest_service.ingest(ingest_service.BearerToken(g.bearer_digest), body,
                                         request.headers.get("Idempotency-Key"), traceparent)
        tracing.annotate(span, **{"promesa.event_id": accepted.id, "promesa.deliveries": accepted.deliveries})
    return jsonify(shapes.accepted(accepted)), 202


def ingest_span(route: str, traceparent: str | None):
    """The ingest request's server span, a child of the producer's traceparent (dashboard.core.tracing)."""
    return tracing.span(f"POST {route}", "server", traceparent, **{"http.request.method": "POST", "http.route": route})


@bp.post("/events/batch")
@operation("Accept up to 500 events in one request and one transaction; one bad event rejects the batch "
           "(the error names its index) and nothing is stored", body=schemas.EventBatch, headers=(TRACEPARENT,),
           responses={202: schemas.AcceptedBatch}, errors=(409, 422, 429))
def create_events(body: schemas.EventBatch):
    """Many events in one request and one transaction: for producers with a lot to say."""
    if "Idempotency-Key" in request.headers:
        raise ApiError(400, "Idempotency-Key applies to single events; give each event of a batch its own id")
    for i, event in enumerate(body.events):
        refuse_reserved(event.type, f"events[{i}].type")
    traceparent = tracing.traceparent(request.headers.get(tracing.HEADER))
    with ingest_span("/api/v1/events/batch", traceparent) as span:
        accepted = ingest_service.ingest_many(g.team, body.events, traceparent=traceparent)
        tracing.annotate(span, **{"promesa.events": len(accepted),
                                  "promesa.deliveries": sum(a.deliveries for a in accepted)})
    return jsonify(data=[shapes.accepted(a) for a in accepted]), 202


@bp.get("/events/<event_id>")
@operation("An event with its deliveries and their attempts", responses={200: schemas.Event})
def get_event(event_id):
    event = ingest_service.team_event(g.team, event_id)
    if event is None:
        raise ApiError(404, f"no event {event_id!r} in your team")
    return jsonify(shapes.event(event))


@bp.post("/subscriptions")
@operation("Create a subscription; its signing secret (and a pull subscription's key) is shown in this answer "
           "only. \"check\": true also "
           "runs the receiver check on it (check_id)",
           body=schemas.SubscriptionInput, responses={201: schemas.CreatedSubscription}, errors=(409, 422, 429),
           links_to="subscription_id")
def create_subscription(body: schemas.SubscriptionInput):
    if body.check:  # refused before anything is stored: the team's check limit, not the subscription's
        check_service.refuse_if_busy(g.team.id)
    sub, secret = subscription_service.create(g.team, body)
    started = check_service.start(sub) if body.check else None
    return jsonify(shapes.subscription(sub) | {"secret": secret, "check_id": started.id if started else None,
                                               "pull_key": sub.new_pull_key}), 201


@bp.get("/subscriptions")
@operation("The team's subscriptions, a page at a time, oldest first", query=schemas.SubscriptionsQuery,
           responses={200: schemas.SubscriptionList})
def list_subscriptions(query: schemas.SubscriptionsQuery):
    # Deleted ones open by id only.
    found = select(Subscription).where(Subscription.team_id == g.team.id, Subscription.deleted_at.is_(None))
    page, next_after = paging.by_id(found, Subscription.id, query.limit, query.after, newest_first=False)
    return jsonify(data=[shapes.subscription(s) for s in page], next_after=next_after)


@bp.get("/subscriptions/<subscription_id>")
@operation("One subscription", responses={200: schemas.Subscription})
def get_subscription(subscription_id):
    return jsonify(shapes.subscription(subscription_service.team_subscription(g.team, subscription_id)))


@bp.patch("/subscriptions/<subscription_id>")
@operation("Edit: url (checked as at creation), event types and versions, payload filter (null clears it), retry "
           "policy, timeouts, description, rate limit, in-flight cap; only the fields given change, and the audit log keeps before and after. "
           "The signature scheme cannot change", body=schemas.SubscriptionEdit,
           responses={200: schemas.Subscription}, errors=(409, 422))
def edit_subscription(subscription_id, body: schemas.SubscriptionEdit):
    sub = subscription_service.team_subscription(g.team, subscription_id)
    subscription_service.edit(sub, body)
    return jsonify(shapes.subscription(sub))


@bp.delete("/subscriptions/<subscription_id>")
@operation("Delete: nothing more is attempted, waiting deliveries end cancelled, the history stays readable",
           responses={200: schemas.Deleted}, errors=(409,))
def delete_subscription(subscription_id):
    sub = subscription_service.team_subscription(g.team, subscription_id)
    cancelled = subscription_service.delete(sub)
    return jsonify(shapes.subscription(sub) | {"cancelled": cancelled})


@bp.post("/subscriptions/<subscription_id>/rotate-secret")
@operation("Rotate the signing secret; the new one is shown in this answer only. During the grace both sign "
           "every delivery (X-Signature: t=…,v1=<new>,v1=<old>; Standard Webhooks: v1,<new> v1,<old>); at most "
           "two secrets sign", body=schemas.RotateInput, body_required=False,
           responses={200: schemas.SubscriptionWithSecret}, errors=(409,))
def rotate_secret(subscription_id, body: schemas.RotateInput):
    sub = subscription_service.team_subscription(g.team, subscription_id)
    secret = rotation.rotate(sub, body.grace_seconds)
    return jsonify(shapes.subscription(sub) | {"secret": secret})


@bp.post("/subscriptions/<subscription_id>/end-grace")
@operation("End a rotation's grace now: only the newest secret signs; the previous one is deleted",
           responses={200: schemas.Subscription}, errors=(409,))
def end_grace(subscription_id):
    sub = subscription_service.team_subscription(g.team, subscription_id)
    subscription_service.not_deleted(sub)
    rotation.end_grace(sub)
    return jsonify(shapes.subscription(sub))


@bp.post("/subscriptions/<subscription_id>/test")
@operation("Send a promesa.test event to this endpoint alone, through the real pipeline (whatever its type "
           "filter and the catalog's strict mode say); one every test_event_seconds (a quota)",
           responses={202: schemas.TestSent}, errors=(409, 429))
def send_test_event(subscription_id):
    sub = subscription_service.team_subscription(g.team, subscription_id)
    event_id, delivery_id = subscription_service.send_test_event(sub)
    return jsonify(event_id=event_id, delivery_id=delivery_id), 202


@bp.get("/subscriptions/<subscription_id>/contract")
@operation("The subscription's published contract, generated from its live configuration",
           responses={200: schemas.Contract})
def subscription_contract(subscription_id):
    sub = subscription_service.team_subscription(g.team, subscription_id)
    return jsonify(shapes.contract(contract_service.build(sub)))


@bp.post("/subscriptions/<subscription_id>/pause")
@operation("Pause: deliveries are held, nothing is dropped; an optional reason is shown and audited",
           body=schemas.PauseInput, body_required=False, responses={200: schemas.Subscription}, errors=(409,))
def pause_subscription(subscription_id, body: schemas.PauseInput):
    sub = subscription_service.team_subscription(g.team, subscription_id)
    subscription_service.pause(sub, body.reason)
    return jsonify(shapes.subscription(sub))


@bp.post("/subscriptions/<subscription_id>/resume")
@operation("Resume: held deliveries are sent", responses={200: schemas.Resumed}, errors=(409,))
def resume_subscription(subscription_id):
    sub = subscription_service.team_subscription(g.team, subscription_id)
    released = subscription_service.resume(sub)
    return jsonify(shapes.subscription(sub) | {"released": released})


@bp.post("/subscriptions/<subscription_id>/replay")
@operation("Replay every dead letter, or re-send the given dead or succeeded deliveries, with a fresh "
           "retry schedule", body=schemas.ReplayInput, body_required=False, responses={202: schemas.Replayed}, errors=(409,))
def replay_subscription(subscription_id, body: schemas.ReplayInput):
    """Replays the subscription's dead letters, or re-sends the given dead or succeeded deliveries."""
    sub = subscription_service.team_subscription(g.team, subscription_id)
    return jsonify(replayed=subscription_service.replay(sub, delivery_ids=body.delivery_ids)), 202


@bp.get("/subscriptions/<subscription_id>/deliveries")
@operation("The subscription's deliveries, newest first", query=schemas.DeliveriesQuery,
           responses={200: schemas.DeliveryPage})
def list_deliveries(subscription_id, query: schemas.DeliveriesQuery):
    sub = subscription_service.team_subscription(g.team, subscription_id)
    page, next_before = subscription_service.deliveries_page(sub, query.state, query.before, query.limit)
    return jsonify(data=[shapes.delivery(d, d.event.id) for d in page], next_before=next_before)


@bp.post("/filters/test")
@operation("Try a payload filter on an event (the thin body, as receivers get it): whether it matches. A filter "
           "that is wrong is a 422 naming where", body=schemas.FilterTestInput,
           responses={200: schemas.FilterTested}, errors=(422,))
def test_filter(body: schemas.FilterTestInput):
    return jsonify(matches=filters.matches(body.filter, body.event))


@bp.post("/event-types")
@operation("Declare an event type version with a JSON Schema for its data. The schema is bounded (size, depth, "
           "$ref expansion: 413 or 422 naming the limit), and so is the catalog (quotas: event_types, "
           "event_type_versions, catalog_bytes, declarations_per_minute)", body=schemas.EventTypeInput,
           responses={201: schemas.EventType}, errors=(409, 413, 422, 429))
def declare_event_type(body: schemas.EventTypeInput):
    refuse_reserved(body.name, "name")
    return jsonify(shapes.event_type(catalog.declare(g.team, body))), 201


@bp.get("/event-types")
@operation("The team's event-type catalog, a page at a time, in the order it was declared",
           query=schemas.EventTypesQuery, responses={200: schemas.EventTypeList})
def list_event_types(query: schemas.EventTypesQuery):
    page, next_after = catalog.team_event_types_page(g.team, query.limit, query.after)
    return jsonify(data=[shapes.event_type(t) for t in page], next_after=next_after)


@bp.get("/team")
@operation("The team's settings and quotas (each with its limit, its default, and what the team uses)",
           responses={200: schemas.Team})
def get_team():
    return jsonify(shapes.team(g.team))


@bp.patch("/team")
@operation("Change the team's settings (strict mode: only declared event types)", body=schemas.TeamUpdate,
           responses={200: schemas.Team})
def update_team(body: schemas.TeamUpdate):
    if body.strict_event_types is not None and body.strict_event_types != g.team.strict_event_types:
        g.team.strict_event_types = body.strict_event_types
        audit.record("team.updated", team_id=g.team.id, detail={"strict_event_types": body.strict_event_types})
        db.session.commit()
    return jsonify(shapes.team(g.team))
