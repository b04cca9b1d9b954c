"""Bulk replay and discard over the API: start one for a subscription (a job, answered at once), then
follow it; "replay since" for a consumer; and "give up now" on scheduled deliveries."""

from __future__ import annotations

from flask import g, jsonify
from sqlalchemy import select

from dashboard import schemas
from dashboard.consumers import service as consumer_service
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError, parse_time
from dashboard.models import ConsumerState, Replay, ReplayKind, Subscription, SubscriptionState
from dashboard.operations import replays as replay_service
from dashboard.subscriptions import service as subscription_service
from dashboard.web.api import bp, shapes
from dashboard.web.api.operations import operation


@bp.post("/subscriptions/<subscription_id>/replays")
@operation("Replay the subscription's dead letters as a job with progress: the answer comes at once; a "
           "second request with the same filter while it runs returns the running one",
           body=schemas.BulkReplayInput, body_required=False, responses={202: schemas.ReplayStarted},
           errors=(422,), links_to="replay_id")
def start_replay(subscription_id, body: schemas.BulkReplayInput):
    """Replays the subscription's dead letters (optionally dead-lettered in [since, until), of these types)."""
    sub = subscription_service.team_subscription(g.team, subscription_id)
    dead = replay_service.DeadLetterFilter(
        subscription_id=sub.id, team_id=sub.team_id, event_types=tuple(body.event_types),
        since=parse_time(body.since, "since"), until=parse_time(body.until, "until"))
    return _started(*replay_service.start(dead))


@bp.post("/consumers/<uid>/replay-since")
@operation("Replay since (recover): every event addressed to the consumer accepted since a time, to one of its "
           "endpoints, as a job with progress. Events with no delivery to it get one (it registered late), dead ones "
           "are sent again, delivered ones are left alone. Follow it at /replays/{id}",
           body=schemas.RecoverInput, responses={202: schemas.ReplayStarted}, errors=(409, 422),
           links_to="replay_id")
def replay_since(uid, body: schemas.RecoverInput):
    consumer = consumer_service.team_consumer(g.team, uid)
    sub = db.session.scalar(select(Subscription).where(Subscription.id == body.subscription_id,
                                                       Subscription.consumer_id == consumer.id))
    if sub is None:
        raise ApiError(422, f"subscription_id: consumer {consumer.uid!r} has no subscription {body.subscription_id!r}")
    return _started(*replay_service.start_recover(consumer, sub, parse_time(body.since, "since")))


def _started(replay: Replay, started: bool):
    sub = db.session.get(Subscription, replay.subscription_id)
    consumer_disabled = sub.consumer is not None and sub.consumer.state == ConsumerState.DISABLED
    held = replay.kind in ReplayKind.SENDS and (sub.state != SubscriptionState.ACTIVE or consumer_disabled)
    return jsonify(shapes.replay_started(replay, started) | {"held_until_resume": held}), 202


@bp.post("/subscriptions/<subscription_id>/discards")
@operation("Discard the subscription's dead letters (the given ones, or those the filter matches) as a job: "
           "they end `discarded`, are never sent again and stay readable; follow it at /replays/{id}",
           body=schemas.DiscardInput, body_required=False, responses={202: schemas.ReplayStarted},
           errors=(409, 422), links_to="replay_id")
def start_discard(subscription_id, body: schemas.DiscardInput):
    """Discards dead letters (optionally dead-lettered in [since, until), of these types, or these ids)."""
    sub = subscription_service.not_deleted(subscription_service.team_subscription(g.team, subscription_id))
    dead = replay_service.DeadLetterFilter(
        subscription_id=sub.id, team_id=sub.team_id, event_types=tuple(body.event_types),
        since=parse_time(body.since, "since"), until=parse_time(body.until, "until"),
        delivery_ids=tuple(body.delivery_ids))
    return _started(*replay_service.start(dead, ReplayKind.DISCARD))


@bp.post("/subscriptions/<subscription_id>/give-up")
@operation("Give up now on scheduled deliveries (the given ones, or all of the subscription's): they become "
           "dead letters at once instead of waiting out their retry schedule",
           body=schemas.GiveUpInput, body_required=False, responses={200: schemas.GivenUp}, errors=(409,))
def give_up(subscription_id, body: schemas.GiveUpInput):
    sub = subscription_service.team_subscription(g.team, subscription_id)
    return jsonify(given_up=subscription_service.give_up(sub, body.delivery_ids))


@bp.get("/replays/<replay_id>")
@operation("A replay's progress: re-queued so far, and the outcomes of the replayed deliveries",
           responses={200: schemas.BulkReplay})
def get_replay(replay_id):
    replay = db.session.get(Replay, replay_id)
    if replay is None or replay.team_id != g.team.id:
        raise ApiError(404, f"no replay {replay_id!r} in your team")
    return jsonify(shapes.replay(replay))
