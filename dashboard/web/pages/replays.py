"""Bulk replays: their progress (a partial htmx polls until the replay ends), the recent ones,
cancelling, and "replay dead letters since …" from a subscription's page."""

from __future__ import annotations

import datetime as dt

from flask import abort, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from dashboard.accounts import access
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError, parse_time
from dashboard.delivery import failures
from dashboard.models import ConsumerState, Replay, ReplayKind, ReplayState, Subscription, SubscriptionState
from dashboard.operations import recover
from dashboard.operations import replays as replay_service
from dashboard.operations import subscription_status
from dashboard.web.pages import both, bp
from dashboard.web.pages.formatting import age


def replay_or_404(replay_id: str) -> Replay:
    replay = db.session.get(Replay, replay_id)
    if replay is None or not access.can_view_replay(current_user, replay):
        abort(404)
    return replay


def show_started(replay: Replay, started: bool):
    """Answer a replay (or discard) button at once: to its progress page (the one already running, if any).
    A replay of a paused or disabled subscription says its deliveries will be held."""
    if not started:
        what = "replay since" if replay.kind == ReplayKind.RECOVER else replay.kind
        flash(f"This {what} is already running: here it is.", "ok")
    elif replay.kind == ReplayKind.DISCARD:
        flash(f"Discarding {replay.total} dead letters: they will never be sent, and stay readable.", "ok")
    elif replay.kind == ReplayKind.RECOVER:
        flash(f"{recover_words(replay)}: {replay.total} to send.{held_note(replay.subscription_id)}", "ok")
    else:
        flash(f"Replaying {replay.total} dead letters.{held_note(replay.subscription_id)}", "ok")
    return redirect(url_for(".replay_progress", replay_id=replay.id))


def recover_words(replay: Replay) -> str:
    """What a recover does: "Sending the events addressed to cus_1 since 2026-12-01 09:00 UTC that its endpoint
    never received or that died" (the endpoint is named beside it on every page that shows one)."""
    recovered = recover.RecoverFilter.from_json(replay.filter)
    return (f"Sending the events addressed to {recovered.consumer} since {recovered.since:%Y-%m-%d %H:%M:%S} UTC "
            "that this endpoint never received or that died")


def held_note(subscription_id: str | None) -> str:
    """" They are held until resume …" when the subscription (or its consumer) is paused or disabled; "" otherwise."""
    sub = db.session.get(Subscription, subscription_id) if subscription_id else None
    if sub is not None and sub.consumer is not None and sub.consumer.state == ConsumerState.DISABLED:
        return f" Consumer {sub.consumer.uid} is disabled: they are held until it is enabled, nothing is sent before."
    if sub is None or sub.state == SubscriptionState.ACTIVE:
        return ""
    until = "it is enabled" if sub.state == SubscriptionState.DISABLED else "you resume it"
    return f" The subscription is {sub.state}: they are held until {until}, nothing is sent before."


def failing_note(st: subscription_status.Status, now: dt.datetime) -> str | None:
    """Said before a replay starts, blocking nothing: "its last attempt failed 40 s ago with HTTP 503 …" while
    the endpoint fails now (subscription_status.Status.failing_now); None otherwise."""
    failure = st.failing_now(now)
    if failure is None:
        return None
    what = failures.words(failure.status_code, failure.error)
    opened = ", and an incident about it is open" if st.incidents else ""
    return (f"its last attempt failed {age(failure.attempted_at, now)} ago with {what}{opened}: "
            "these will likely fail again and return to the dead letters")


def can_cancel(replay: Replay) -> bool:
    if access.is_portal(current_user):  # its own endpoint's job (replay_or_404 let it see no other): it may stop it
        return access.can_view_replay(current_user, replay)
    teams = access.operable_team_ids(current_user)
    if teams is None:
        return replay.team_id is None or replay.team_id != access.hidden_team_id(current_user)
    return replay.team_id in teams


@bp.get("/replays")
@login_required
def replays():
    return render_template("replays/list.html", replays=replay_service.recent(
        access.visible_to(current_user, Replay.team_id)))


@both("/replays/<replay_id>", methods=["GET"])
@login_required
def replay_progress(replay_id):
    replay = replay_or_404(replay_id)
    outcome = replay_service.outcomes(replay.id)
    # Poll fast while it runs, slowly while replayed deliveries are still on their way, then stop.
    if replay.state in ReplayState.ACTIVE:
        poll = "500ms"
    else:
        poll = "2s" if replay.state == ReplayState.FINISHED and outcome["waiting"] else None
    template = "replays/_progress.html" if request.headers.get("HX-Request") else "replays/page.html"
    sub = db.session.get(Subscription, replay.subscription_id) if replay.subscription_id else None
    return render_template(template, replay=replay, outcome=outcome, poll=poll, can_cancel=can_cancel(replay),
                           progress=replay_service.progress_word(replay, outcome), subscription=sub,
                           recovered=recovered(replay))


@bp.app_template_global("recovered")
def recovered(replay: Replay) -> recover.RecoverFilter | None:
    """A recover's filter as pages name it (its consumer's uid, its since), for the filter line; None otherwise."""
    return recover.RecoverFilter.from_json(replay.filter) if replay.kind == ReplayKind.RECOVER else None


@both("/replays/<replay_id>/cancel", methods=["POST"])
@login_required
def cancel_replay(replay_id):
    # Stops a queued or running replay between chunks; what was re-queued already stays re-queued.
    replay = replay_or_404(replay_id)
    access.require(can_cancel(replay))
    if replay_service.cancel(replay):
        what = "events" if replay.kind == ReplayKind.RECOVER else "dead letters"
        flash(f"Cancelled after {replay.done} of {replay.total} {what}.", "ok")
    else:
        flash(f"This replay had already {replay.state}.", "ok")
    return redirect(url_for(".replay_progress", replay_id=replay.id))


@both("/subscriptions/<subscription_id>/replays", methods=["POST"])
@login_required
def replay_since(subscription_id):
    # "Replay dead letters since …": this subscription's dead letters from a time on, as a job.
    sub = access.visible_subscription(subscription_id, need=access.can_operate)
    try:
        since = parse_time(request.form.get("since"), "since")
        dead = replay_service.DeadLetterFilter(subscription_id=sub.id, team_id=sub.team_id, since=since)
    except ApiError as exc:
        abort(exc.status, exc.message)
    return show_started(*replay_service.start(dead))
