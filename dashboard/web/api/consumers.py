"""The consumers API: the parties a team addresses its events to (its customers), by the uid the team chose."""

from __future__ import annotations

import re

from flask import g, jsonify

from dashboard import schemas
from dashboard.consumers import portal
from dashboard.consumers import service as consumer_service
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.models import CONSUMER_UID_PATTERN
from dashboard.web.api import bp, shapes
from dashboard.web.api.operations import operation

_UID = re.compile(CONSUMER_UID_PATTERN)


def _uid(uid: str) -> str:
    if not _UID.fullmatch(uid):
        raise ApiError(422, f"uid must be {schemas.CONSUMER_UID_WORDS}")
    return uid


def _shape(consumer) -> dict:
    return shapes.consumer(consumer, consumer_service.subscription_counts([consumer.id]).get(consumer.id, 0))


@bp.put("/consumers/<uid>")
@operation("Create a consumer, or update it (idempotent): 201 when created, 200 after. Its uid is yours (your "
           "customer's id); an event with \"consumer\": uid reaches only its subscriptions. \"state\": \"disabled\" "
           "holds its deliveries", body=schemas.ConsumerInput, body_required=False,
           responses={200: schemas.Consumer, 201: schemas.Consumer}, errors=(409, 413, 422))
def put_consumer(uid, body: schemas.ConsumerInput):
    consumer, created = consumer_service.upsert(g.team, _uid(uid), body)
    return jsonify(_shape(consumer)), 201 if created else 200


@bp.get("/consumers/<uid>")
@operation("One consumer", responses={200: schemas.Consumer}, errors=(422,))
def get_consumer(uid):
    return jsonify(_shape(consumer_service.team_consumer(g.team, _uid(uid))))


@bp.get("/consumers")
@operation("The team's consumers, a page at a time, by uid; prefix: only uids starting with it",
           query=schemas.ConsumersQuery, responses={200: schemas.ConsumerList})
def list_consumers(query: schemas.ConsumersQuery):
    page, next_after = consumer_service.page(g.team, query.prefix, query.limit, query.after)
    counts = consumer_service.subscription_counts([c.id for c in page])
    return jsonify(data=[shapes.consumer(c, counts.get(c.id, 0)) for c in page], next_after=next_after)


@bp.delete("/consumers/<uid>")
@operation("Delete (soft): out of routing, its subscriptions deleted with it; what was accepted for it is still "
           "delivered (held deliveries are released). Its uid may then name a new consumer",
           responses={200: schemas.DeletedConsumer}, errors=(422,))
def delete_consumer(uid):
    consumer = consumer_service.team_consumer(g.team, _uid(uid))
    released = consumer_service.delete(consumer)
    return jsonify(shapes.consumer(consumer, 0) | {"released": released})


@bp.post("/consumers/<uid>/portal-links")
@operation("A link that signs one browser in to the consumer's portal, where it manages its own endpoints. It works "
           "once, and the session it opens ends when the link expires (expires_in: 60 s to 7 days, 1 hour by default)",
           body=schemas.PortalLinkInput, body_required=False, responses={201: schemas.PortalLink}, errors=(409, 422))
def create_portal_link(uid, body: schemas.PortalLinkInput):
    url, link = portal.create_link(consumer_service.team_consumer(g.team, _uid(uid)), body.expires_in)
    return jsonify(url=url, expires_at=shapes.iso(link.expires_at)), 201


@bp.delete("/consumers/<uid>/portal-sessions")
@operation("End every portal session of the consumer, and every link not yet opened (disabling or deleting the "
           "consumer does too)", responses={200: schemas.PortalSessionsRevoked}, errors=(422,))
def revoke_portal_sessions(uid):
    revoked = portal.revoke(consumer_service.team_consumer(g.team, _uid(uid)), "revoked")
    db.session.commit()
    return jsonify(revoked=revoked)


@bp.get("/portal-settings")
@operation("The team's consumer portal: who may frame it, its accent colour and logo",
           responses={200: schemas.PortalSettings})
def get_portal_settings():
    return jsonify(portal.settings(g.team))


@bp.put("/portal-settings")
@operation("Change the team's consumer portal settings; fields not given keep their value",
           body=schemas.PortalSettingsInput, responses={200: schemas.PortalSettings}, errors=(422,))
def put_portal_settings(body: schemas.PortalSettingsInput):
    team = portal.update_settings(g.team, frame_ancestors=body.frame_ancestors, accent_color=body.accent_color,
                                  logo_url=body.logo_url, given=frozenset(body.model_fields_set))
    return jsonify(portal.settings(team))
