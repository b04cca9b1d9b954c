"""Dead letters across every subscription you may see, filtered, with "replay the N matching" and
"replay selected" (or discard them) for those who may operate (a bulk replay runs as a job: dashboard.operations.replays)."""

from __future__ import annotations

import dataclasses

from flask import abort, current_app, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required
from sqlalchemy import literal, select

from dashboard.accounts import access
from dashboard.consumers import service as consumer_service
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.models import Delivery, DeliveryState, ReplayKind, Subscription, Team
from dashboard.operations import replays as replay_service
from dashboard.operations import subscription_status
from dashboard.web.pages import bp
from dashboard.web.pages.formatting import subscription_label
from dashboard.web.pages.replays import failing_note, show_started

PAGE = 50
# The replay form warns about the endpoints of at most this many of the matching dead letters' subscriptions.
FAILING_CHECKED = 10


def operable(dead: replay_service.DeadLetterFilter) -> replay_service.DeadLetterFilter | None:
    """The filter narrowed to the teams the signed-in user may operate (an owner's never reaches past
    the owner's team); None when the user may replay none of it."""
    teams = access.operable_team_ids(current_user)
    if teams is None:
        hidden = access.hidden_team_id(current_user)
        if hidden is None:
            return dead
        return None if dead.team_id == hidden else dataclasses.replace(dead, hidden_team_id=hidden)
    if not teams or (dead.team_id is not None and dead.team_id not in teams):
        return None
    return dataclasses.replace(dead, team_id=teams[0])


def own_team_default(args) -> dict:
    """The filter's arguments, with the user's own team when a consumer is named without one (an owner's or
    member's consumer filter needs no team picked: a uid names a consumer within one team)."""
    args = args.to_dict()
    if args.get("consumer") and not args.get("team") and current_user.role not in access.GLOBAL_READERS \
            and current_user.team_id is not None:
        args["team"] = str(current_user.team_id)
    return args


@bp.get("/dead-letters")
@login_required
def dead_letters():
    visible = access.visible_to(current_user, Subscription.team_id)
    error = None
    try:
        dead = replay_service.DeadLetterFilter.from_args(own_team_default(request.args))
        rows, cursor = replay_service.page(dead.where(visible), request.args.get("before"), PAGE)
    except ApiError as exc:
        error, dead = exc, replay_service.DeadLetterFilter()
        rows, cursor = replay_service.page(dead.where(visible), None, PAGE)
    matching = replay_service.count(dead.where(visible))
    narrowed = operable(dead)
    may_replay = narrowed is not None
    replayable = matching if narrowed == dead or not may_replay else replay_service.count(narrowed.where(visible))
    subs = endpoint_choices(dead)
    teams = db.session.scalars(access.restrict(select(Team), current_user, Team.id).order_by(Team.name)).all()
    warnings = failing_notes(dead.where(visible)) if may_replay and matching else []
    return render_template("dead_letters/page.html", dead=dead, args=dead.as_args(), rows=rows, cursor=cursor,
                           matching=matching, replayable=replayable, may_replay=may_replay, subscriptions=subs,
                           replay_warnings=warnings,
                           teams=teams, error=error.message if error else None), error.status if error else 200


def endpoint_choices(dead: replay_service.DeadLetterFilter) -> list[Subscription]:
    """The filter's endpoints to pick from: a chosen consumer's own; otherwise the teams' own endpoints and, of
    their consumers' (there may be 100,000), those with dead letters (from the dead deliveries' partial index),
    and the one chosen."""
    subs_query = access.restrict(select(Subscription), current_user, Subscription.team_id)
    if dead.team_id is not None:
        subs_query = subs_query.where(Subscription.team_id == dead.team_id)
    if dead.consumer:
        return db.session.scalars(subs_query.where(Subscription.consumer_id.in_(
            consumer_service.ids_named(dead.team_id, dead.consumer))).order_by(Subscription.url)).all()
    own = db.session.scalars(subs_query.where(Subscription.consumer_id.is_(None))).all()
    with_dead = select(Delivery.subscription_id).where(Delivery.state == DeliveryState.DEAD).distinct()
    if dead.subscription_id:
        with_dead = with_dead.union(select(literal(dead.subscription_id)))
    consumers = db.session.scalars(subs_query.where(Subscription.consumer_id.is_not(None),
                                                    Subscription.id.in_(with_dead))).all()
    return sorted(own + consumers, key=lambda sub: (sub.target, sub.id))


def failing_notes(where: list) -> list[str]:
    """For the subscriptions of the matching dead letters (the first FAILING_CHECKED), what a replay should know
    first: each one whose endpoint fails now, named, with its last failure."""
    now = current_app.config["CLOCK"].now()
    ids = db.session.scalars(select(Delivery.subscription_id).where(*where).distinct()
                             .order_by(Delivery.subscription_id).limit(FAILING_CHECKED)).all()
    notes = []
    for sub in db.session.scalars(select(Subscription).where(Subscription.id.in_(ids)).order_by(Subscription.id)):
        note = failing_note(subscription_status.status(sub, now), now)
        if note:
            notes.append(f"{subscription_label(sub)}: {note}")
    return notes


@bp.post("/dead-letters/replay")
@login_required
def replay_dead_letters():
    # Replays the dead letters matching the filter, or the selected ones, as a job with progress.
    return _start_job(ReplayKind.REPLAY)


@bp.post("/dead-letters/discard")
@login_required
def discard_dead_letters():
    # Discards the dead letters matching the filter, or the selected ones, as a job: never sent, still readable.
    return _start_job(ReplayKind.DISCARD)


def _start_job(kind: str):
    if access.operable_team_ids(current_user) == []:
        abort(403)
    try:
        dead = replay_service.DeadLetterFilter.from_args(own_team_default(request.form))
        if request.form.get("which") == "selected":
            selected = tuple(request.form.getlist("delivery_id"))
            if not selected:
                flash(f"Select the dead letters to {kind} first.", "error")
                return redirect(url_for(".dead_letters", **dead.as_args()))
            dead = replay_service.DeadLetterFilter(delivery_ids=selected)
    except ApiError as exc:
        abort(exc.status, exc.message)
    narrowed = operable(dead)
    access.require(narrowed is not None)
    return show_started(*replay_service.start(narrowed, kind))
