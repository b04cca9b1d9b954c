"""Pull delivery over the API (dashboard.delivery.pull): a pull subscription's client leases due deliveries,
then answers each with an ack."""

from __future__ import annotations

from flask import current_app, g, jsonify, request

from dashboard import schemas
from dashboard.core.clock import iso
from dashboard.core.validation import ApiError
from dashboard.delivery import pull as pull_service
from dashboard.models import Subscription, SubscriptionMode
from dashboard.subscriptions import pull_keys
from dashboard.subscriptions import service as subscription_service
from dashboard.web import long_poll
from dashboard.web.api import bp
from dashboard.web.api.operations import authenticate, bearer_token, operation


def _with_pull_key_or_team_token(subscription_id: str) -> None:
    """The subscription's own pull key, or a token of its team (g.team, as every API route has it)."""
    token = bearer_token()
    if not pull_keys.is_pull_key(token):
        authenticate()
        return
    sub = pull_keys.subscription_of(token)
    if sub is None or sub.id != subscription_id:
        raise ApiError(401, "this pull key pulls no such subscription: it belongs to another, or was replaced")
    g.team, g.api_token_prefix = sub.team, sub.pull_key_prefix


def _pull_subscription(subscription_id: str) -> Subscription:
    sub = subscription_service.not_deleted(subscription_service.team_subscription(g.team, subscription_id))
    if sub.mode != SubscriptionMode.PULL:
        raise ApiError(409, "this is a push subscription: its deliveries are POSTed to its URL, not pulled")
    return sub


@bp.get("/subscriptions/<subscription_id>/pull")
@operation("Lease up to `limit` due deliveries of a pull subscription for `lease` seconds, each with the exact "
           "body and the signature headers a push would carry (verify them as a push's). No other client gets "
           "them meanwhile; one not acked in time counts as a failed attempt. Empty while the subscription or its "
           "consumer is paused or disabled. With `wait`, an empty answer waits up to that many seconds for a "
           "delivery to become due (429 when the team already has too many pulls waiting, 503 when this server "
           "has)", query=schemas.PullQuery, responses={200: schemas.PulledList}, errors=(409, 429, 503),
           authenticate_with=_with_pull_key_or_team_token)
def pull_deliveries(subscription_id, query: schemas.PullQuery):
    sub = _pull_subscription(subscription_id)
    environ = request.environ
    waited = long_poll.waiting(environ)
    if waited is not None and waited.refused:
        status, reason, fields = waited.refused
        error = ApiError(status, reason)
        error.fields, error.headers = fields, {"Retry-After": "1"}
        raise error
    seen = long_poll.seen(environ, sub.id)  # before the look: an announcement after it wakes the wait at once
    pulled = pull_service.pull(sub, query.limit, query.lease)
    if not pulled and query.wait and long_poll.can_park(environ) and not (waited is not None and waited.final):
        long_poll.park(environ, sub.id, str(g.team.id), seen, query.wait, _due_in(sub))
    return jsonify(data=[{"delivery_id": p.delivery_id, "attempt": p.attempt, "body": p.body, "headers": p.headers}
                         for p in pulled])


def _due_in(sub: Subscription) -> float | None:
    """Seconds until a pull of it finds something without a new event (None: only an event, a resume or
    the deadline can)."""
    if not pull_service.hands_out(sub):
        return None
    due = pull_service.next_due(sub)
    if due is None:
        return None
    # At least a tenth of a second: what was due but taken by other clients meanwhile is not looked at in a loop.
    return max(0.1, (due - current_app.config["CLOCK"].now()).total_seconds())


@bp.post("/subscriptions/<subscription_id>/pull/ack")
@operation("Answer pulled deliveries: each entry is recorded as its attempt (its duration counted from the pull); "
           "a 2xx status settles it, anything else (or null) follows the retry policy as a failed push. An entry "
           "whose lease ran out or passed to another client is refused (409 in its result) and nothing is "
           "recorded for it", body=schemas.AckInput, responses={200: schemas.AckResults}, errors=(409,),
           authenticate_with=_with_pull_key_or_team_token)
def ack_deliveries(subscription_id, body: schemas.AckInput):
    sub = _pull_subscription(subscription_id)
    return jsonify(data=[{"delivery_id": a.delivery_id, "status": a.status, "state": a.state,
                          "next_attempt_at": iso(a.next_attempt_at), "error": a.error}
                         for a in pull_service.ack(sub, body.root)])


@bp.post("/subscriptions/<subscription_id>/pull-key")
@operation("Replace a pull subscription's key at once: the new one is shown in this answer only, and the one "
           "before pulls nothing from now on (a team token is needed: a pull key cannot replace itself)",
           responses={200: schemas.PullKey}, errors=(409,))
def replace_pull_key(subscription_id):
    sub = subscription_service.team_subscription(g.team, subscription_id)
    return jsonify(pull_key=pull_keys.replace(sub), pull_key_prefix=sub.pull_key_prefix)
