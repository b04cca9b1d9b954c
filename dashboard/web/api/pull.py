"""Pull delivery over the API (dashboard.delivery.pull): a pull subscription's client leases due deliveries,
then answers each with an ack."""

from __future__ import annotations

from flask import g, jsonify

from dashboard import schemas
from dashboard.core.clock import iso
from dashboard.core.validation import ApiError
from dashboard.delivery import pull as pull_service
from dashboard.models import Subscription, SubscriptionMode
from dashboard.subscriptions import service as subscription_service
from dashboard.web.api import bp
from dashboard.web.api.operations import operation


def _pull_subscription(subscription_id: str) -> Subscription:
    sub = subscription_service.not_deleted(subscription_service.team_subscription(g.team, subscription_id))
    if sub.mode != SubscriptionMode.PULL:
        raise ApiError(409, "this is a push subscription: its deliveries are POSTed to its URL, not pulled")
    return sub


@bp.get("/subscriptions/<subscription_id>/pull")
@operation("Lease up to `limit` due deliveries of a pull subscription for `lease` seconds, each with the exact "
           "body and the signature headers a push would carry (verify them as a push's). No other client gets "
           "them meanwhile; one not acked in time counts as a failed attempt. Empty while the subscription or its "
           "consumer is paused or disabled", query=schemas.PullQuery, responses={200: schemas.PulledList},
           errors=(409,))
def pull_deliveries(subscription_id, query: schemas.PullQuery):
    sub = _pull_subscription(subscription_id)
    pulled = pull_service.pull(sub, query.limit, query.lease)
    return jsonify(data=[{"delivery_id": p.delivery_id, "attempt": p.attempt, "body": p.body, "headers": p.headers}
                         for p in pulled])


@bp.post("/subscriptions/<subscription_id>/pull/ack")
@operation("Answer pulled deliveries: each entry is recorded as its attempt (its duration counted from the pull); "
           "a 2xx status settles it, anything else (or null) follows the retry policy as a failed push. An entry "
           "whose lease ran out or passed to another client is refused (409 in its result) and nothing is "
           "recorded for it", body=schemas.AckInput, responses={200: schemas.AckResults}, errors=(409,))
def ack_deliveries(subscription_id, body: schemas.AckInput):
    sub = _pull_subscription(subscription_id)
    return jsonify(data=[{"delivery_id": a.delivery_id, "status": a.status, "state": a.state,
                          "next_attempt_at": iso(a.next_attempt_at), "error": a.error}
                         for a in pull_service.ack(sub, body.root)])
