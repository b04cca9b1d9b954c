"""Consumers: a team's list (search by uid prefix or name, paged by uid) with its consumer portal's settings, and
one consumer's page (its endpoints' health, its dead letters, disable and enable, "replay since" with a preview of
what it sends), and the consumer filter other pages share. Roles as for subscriptions: owners repair their own
team's consumers, operators and admins any team's, the rest read; the portal's settings are the team's owners' and
admins' to change (as its tokens are: a token may change them too, PUT /api/v1/portal-settings)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re

from flask import abort, current_app, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required
from sqlalchemy import select
from sqlalchemy.orm import joinedload

from dashboard.accounts import access
from dashboard.consumers import portal
from dashboard.consumers import service as consumer_service
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError, parse_id, parse_time
from dashboard.models import CONSUMER_UID_PATTERN, Consumer, ConsumerState, Subscription, Team
from dashboard.operations import recover
from dashboard.operations import replays as replay_service
from dashboard.schemas import CONSUMER_UID_WORDS
from dashboard.stats import overview as figures
from dashboard.subscriptions import checks as check_service
from dashboard.web.pages import bp
from dashboard.web.pages.replays import show_started
from dashboard.web.pages.subscriptions import held_words, released_words

PAGE = 50
DEAD_LETTERS = 20
MAX_REASON = 500
_UID = re.compile(CONSUMER_UID_PATTERN)
REPAIR_WORDS = ("disable or enable this consumer", "operators and admins, and owners of its team")
RECOVER_WORDS = ("replay this consumer's events", "operators and admins, and owners of its team")
PORTAL_WORDS = ("change this team's consumer portal settings", "admins, and owners of the team")
# The colour picker's value when the team has no accent: the portal's top bar as it is then (static/promesa.css).
DEFAULT_ACCENT = "#1d2330"


def pickable_teams() -> list[Team]:
    """The teams whose consumers this user may see: an owner's or member's own, every team for the others."""
    return db.session.scalars(access.restrict(select(Team), current_user, Team.id)
                              .where(Team.name != access.SYSTEM_TEAM).order_by(Team.name)).all()


def chosen_team(teams: list[Team], args) -> Team | None:
    """The team `args["team"]` (an id) names among `teams`, or the only one; 404 for a team one may not see."""
    try:
        team_id = parse_id(args.get("team"), "team")
    except ApiError as exc:
        abort(exc.status, exc.message)
    if team_id is None:
        return teams[0] if len(teams) == 1 else None
    team = next((t for t in teams if t.id == team_id), None)
    if team is None:
        abort(404)
    return team


@dataclasses.dataclass(frozen=True)
class ConsumerFilter:
    """A page's "consumer" filter: a uid within one team (a uid means nothing across teams)."""
    teams: list[Team]
    team: Team | None
    uid: str | None

    def args(self) -> dict:
        """The query string that keeps this filter (for links and htmx polls)."""
        return {k: v for k, v in (("team", self.team.id if self.team else None), ("consumer", self.uid)) if v}


def consumer_filter(args) -> ConsumerFilter:
    """The filter from a query string: 400 for a malformed uid, or a uid without a team when several may be seen."""
    teams = pickable_teams()
    team = chosen_team(teams, args)
    uid = (args.get("consumer") or "").strip() or None
    if uid is not None and not _UID.match(uid):
        abort(400, f"consumer must be {CONSUMER_UID_WORDS}")
    if uid is not None and team is None:
        abort(400, f"choose the team of consumer {uid!r}: a uid names a consumer within one team")
    return ConsumerFilter(teams, team, uid)


def visible_consumer(team_id: int, uid: str, *, repair: tuple[str, str] | None = None) -> Consumer:
    """The team's live consumer with this uid if the user may see the team (404 otherwise: another team's consumer
    does not exist, as far as they can tell); with `repair` (what is refused, who may), 403 unless the user may
    repair it."""
    if not access.can_view_team(current_user, team_id) or not _UID.match(uid):
        abort(404)
    consumer = db.session.scalar(select(Consumer).where(Consumer.team_id == team_id, Consumer.uid == uid,
                                                        Consumer.deleted_at.is_(None))
                                 .options(joinedload(Consumer.team)))
    if consumer is None:
        abort(404)
    if repair:
        access.require(access.can_operate_team(current_user, team_id), *repair)
    return consumer


@bp.get("/consumers")
@login_required
def consumers():
    teams = pickable_teams()
    return consumers_page(teams, chosen_team(teams, request.args), request.args)


def consumers_page(teams: list[Team], team: Team | None, args, portal_error: str | None = None, portal_form=None):
    """The team's consumers and its portal's settings; with `portal_error`, the settings form refused (422), as it
    was sent."""
    q = (args.get("q") or "").strip()[:200]
    after = (args.get("after") or "").strip()[:100] or None
    shown, next_after, health = [], None, {}
    if team is not None:
        shown, next_after = consumer_service.search_page(team, q, PAGE, after) if q else \
            consumer_service.page(team, None, PAGE, after)
        rows = figures.overview_rows(db.session, consumer_service.endpoints_of(team.id, [c.id for c in shown]),
                                     current_app.config["CLOCK"].now())
        health = figures.consumer_health(rows)
    return render_template("consumers/page.html", teams=teams, team=team, q=q, consumers=shown, health=health,
                           next_after=next_after, after=after,
                           portal_settings=portal.settings(team) if team is not None else None,
                           can_set_portal=team is not None and access.can_manage_tokens(current_user, team.id),
                           default_accent=DEFAULT_ACCENT, portal_error=portal_error,
                           portal_form=portal_form), 422 if portal_error else 200


def accent_asked(form, stored: str | None) -> str:
    """The accent the settings form asks for: its text field if that was changed (emptied: the default colours),
    else its colour picker if that was moved (it cannot be empty, so it shows DEFAULT_ACCENT for none)."""
    typed = (form.get("accent_color") or "").strip()
    picked = (form.get("accent_picker") or "").strip().lower()
    if typed.lower() != (stored or "") or not picked or picked == (stored or DEFAULT_ACCENT):
        return typed
    return picked


@bp.post("/consumers/portal-settings/<int:team_id>")
@login_required
def portal_settings(team_id):
    """Change the team's portal settings: who may frame it, its accent colour, its logo. All or nothing: a value
    refused shows the form again, as sent, with what is wrong (422), and nothing is stored."""
    teams = pickable_teams()
    team = next((t for t in teams if t.id == team_id), None)
    if team is None:
        abort(404)
    access.require(access.can_manage_tokens(current_user, team.id), *PORTAL_WORDS)
    form = request.form
    asked = {name: value for name, value in (
        ("frame_ancestors", [line.strip() for line in form.get("frame_ancestors", "").splitlines() if line.strip()]),
        ("accent_color", accent_asked(form, team.portal_accent)),
        ("logo_url", form.get("logo_url", "").strip())) if name in form}
    before = portal.settings(team)
    try:
        portal.update_settings(team, given=frozenset(asked), **asked)
    except ApiError as exc:
        db.session.rollback()
        return consumers_page(teams, team, {}, portal_error=exc.message, portal_form=form)
    flash("Portal settings saved." if portal.settings(team) != before else "Portal settings: nothing changed.", "ok")
    return redirect(url_for(".consumers", team=team.id, _anchor="portal"))


@bp.get("/consumers/<int:team_id>/<uid>")
@login_required
def consumer(team_id, uid):
    return consumer_page(visible_consumer(team_id, uid))


def consumer_page(found: Consumer, recover_error: str | None = None, recover_form=None):
    """A consumer's page; with `recover_error`, its "replay since" form refused (422), the form as it was sent."""
    team_id, uid = found.team_id, found.uid
    now = current_app.config["CLOCK"].now()
    rows = figures.overview_rows(db.session, consumer_service.endpoints_of(team_id, [found.id]), now)
    dead = replay_service.DeadLetterFilter(team_id=team_id, consumer=uid)
    where = dead.where(access.visible_to(current_user, Subscription.team_id))
    dead_letters, _ = replay_service.page(where, None, DEAD_LETTERS)
    return render_template("consumers/consumer.html", consumer=found, rows=rows, now=now,
                           failed_checks=check_service.latest_failed([r.sub.id for r in rows]),
                           dead_letters=dead_letters, dead_count=replay_service.count(where), dead_args=dead.as_args(),
                           can_repair=access.can_operate_team(current_user, team_id),
                           can_create=access.can_create_in(current_user, team_id),
                           recover_endpoints=[r.sub for r in rows], recover_error=recover_error,
                           recover_form=recover_form or {}), 422 if recover_error else 200


@bp.post("/consumers/<int:team_id>/<uid>/disable")
@login_required
def disable_consumer(team_id, uid):
    # Holds every delivery of its endpoints, with a reason everyone who opens its page reads; "enable" ends it.
    found = visible_consumer(team_id, uid, repair=REPAIR_WORDS)
    reason = (request.form.get("reason") or "").strip()
    if not reason:
        abort(400, "Say why you disable this consumer: the reason is shown to everyone who opens its page.")
    if len(reason) > MAX_REASON or "\x00" in reason:
        abort(400, f"The reason is at most {MAX_REASON} characters, and no NUL characters.")
    if found.state == ConsumerState.DISABLED:
        flash("This consumer was disabled already: nothing changed.", "ok")
    else:
        held = consumer_service.set_state(found, ConsumerState.DISABLED, reason)
        flash(f"Disabled: {held_words(held, 'someone enables it')}", "ok")
    return redirect(url_for(".consumer", team_id=team_id, uid=uid))


@bp.post("/consumers/<int:team_id>/<uid>/enable")
@login_required
def enable_consumer(team_id, uid):
    # Enabling releases every held delivery of its endpoints, except those paused or disabled on their own.
    found = visible_consumer(team_id, uid, repair=REPAIR_WORDS)
    if found.state == ConsumerState.ACTIVE:
        flash("This consumer was active already: nothing changed.", "ok")
    else:
        released = consumer_service.set_state(found, ConsumerState.ACTIVE)
        flash(f"Enabled: {released_words(released)}", "ok")
    return redirect(url_for(".consumer", team_id=team_id, uid=uid))


def recover_asked(found: Consumer, args) -> tuple[Subscription, dt.datetime]:
    """The endpoint and the time a "replay since" form names; ApiError saying what is wrong with them."""
    sub = db.session.scalar(select(Subscription).where(Subscription.id == (args.get("subscription") or ""),
                                                       Subscription.consumer_id == found.id,
                                                       Subscription.deleted_at.is_(None)))
    since = parse_time((args.get("since") or "").strip() or None, "since")
    if sub is None:
        raise ApiError(422, f"Choose one of the endpoints of {found.uid}.")
    if since is None:
        raise ApiError(422, "Say since when: the events accepted from that time on are sent again.")
    if since > current_app.config["CLOCK"].now():
        raise ApiError(422, "Since is in the future: no event was accepted after it yet.")
    return sub, since


@bp.post("/consumers/<int:team_id>/<uid>/replay-since")
@login_required
def recover_consumer(team_id, uid):
    # "Replay since": the consumer's events since a time, to one of its endpoints, as a job with progress.
    found = visible_consumer(team_id, uid, repair=RECOVER_WORDS)
    try:
        return show_started(*replay_service.start_recover(found, *recover_asked(found, request.form)))
    except ApiError as exc:
        return consumer_page(found, recover_error=exc.message, recover_form=request.form)


@bp.get("/consumers/<int:team_id>/<uid>/replay-since")
@login_required
def recover_preview(team_id, uid):
    """What the "replay since" form would send now (htmx asks as its fields change): a count, or what is wrong."""
    found = visible_consumer(team_id, uid, repair=RECOVER_WORDS)
    try:
        sub, since = recover_asked(found, request.args)
    except ApiError as exc:
        return render_template("consumers/_recover_preview.html", error=exc.message)
    wanted = recover.RecoverFilter(consumer_id=found.id, consumer=found.uid, subscription_id=sub.id,
                                   team_id=found.team_id, since=since)
    return render_template("consumers/_recover_preview.html", error=None, since=since,
                           owed=wanted.count(sub, current_app.config["CLOCK"].now()))


def endpoints_query(subscriptions, chosen: ConsumerFilter):
    """`subscriptions` (a query of them) narrowed to the chosen team's, and to the chosen consumer's."""
    if chosen.team is not None:
        subscriptions = subscriptions.where(Subscription.team_id == chosen.team.id)
    if chosen.uid is not None:
        subscriptions = subscriptions.where(
            Subscription.consumer_id.in_(consumer_service.ids_named(chosen.team.id, chosen.uid)))
    return subscriptions
