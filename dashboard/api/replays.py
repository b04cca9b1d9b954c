"""Bulk replay over the API: start one for a subscription (a job, answered at once), then follow it."""

from __future__ import annotations

from flask import g, jsonify

from .. import replays as replay_service
from .. import schemas
from ..extensions import db
from ..models import Replay
from ..validation import ApiError
from . import bp
from .operations import operation
from .routes import subscription_or_404


@bp.post("/subscriptions/<subscription_id>/replays")
@operation("Replay the subscription's dead letters as a job with progress: the answer comes at once; a "
           "second request with the same filter while it runs returns the running one",
           body=schemas.BulkReplayInput, body_required=False, responses={202: schemas.ReplayStarted},
           errors=(422,), links_to="replay_id")
def start_replay(subscription_id, body: schemas.BulkReplayInput):
    """Replays the subscription's dead letters (optionally dead-lettered in [since, until), of these types)."""
    sub = subscription_or_404(subscription_id)
    dead = replay_service.DeadLetterFilter(
        subscription_id=sub.id, team_id=sub.team_id, event_types=tuple(body.event_types),
        since=replay_service.parse_time(body.since, "since"), until=replay_service.parse_time(body.until, "until"))
    replay, started = replay_service.start(dead)
    return jsonify(id=replay.id, total=replay.total, state=replay.state, duplicate=not started), 202


@bp.get("/replays/<replay_id>")
@operation("A replay's progress: re-queued so far, and the outcomes of the replayed deliveries",
           responses={200: schemas.BulkReplay})
def get_replay(replay_id):
    replay = db.session.get(Replay, replay_id)
    if replay is None or replay.team_id != g.team.id:
        raise ApiError(404, f"no replay {replay_id!r} in your team")
    return jsonify(replay_service.describe(replay))
