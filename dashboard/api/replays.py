"""Bulk replay over the API: start one for a subscription (a job, answered at once), then follow it."""

from __future__ import annotations

from flask import g, jsonify, request

from .. import replays as replay_service
from ..extensions import db
from ..models import Replay
from ..validation import ApiError, check_fields
from . import bp
from .routes import json_body, subscription_or_404, token_required


@bp.post("/subscriptions/<subscription_id>/replays")
@token_required
def start_replay(subscription_id):
    """Replays the subscription's dead letters (optionally dead-lettered in [since, until), of these types)."""
    sub = subscription_or_404(subscription_id)
    payload = check_fields(json_body() if request.content_length else {}, {"since", "until", "event_types"})
    event_types = payload.get("event_types", [])
    if not isinstance(event_types, list) or not all(isinstance(t, str) for t in event_types):
        raise ApiError(400, "event_types must be a list of event type names")
    dead = replay_service.DeadLetterFilter(
        subscription_id=sub.id, team_id=sub.team_id, event_types=tuple(event_types),
        since=replay_service.parse_time(payload.get("since"), "since"),
        until=replay_service.parse_time(payload.get("until"), "until"))
    replay, started = replay_service.start(dead)
    return jsonify(id=replay.id, total=replay.total, state=replay.state, duplicate=not started), 202


@bp.get("/replays/<replay_id>")
@token_required
def get_replay(replay_id):
    replay = db.session.get(Replay, replay_id)
    if replay is None or replay.team_id != g.team.id:
        raise ApiError(404, f"no replay {replay_id!r} in your team")
    return jsonify(replay_service.describe(replay))
