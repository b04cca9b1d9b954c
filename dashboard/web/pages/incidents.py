"""Incidents: the list, open first, and the on-call page an alert links to (`/incidents/<id>`):
what fired, since when, the figures, a per-minute chart around it, the last distinct errors, the
dead letters in its window, and the buttons (acknowledge; replay these and pause for operators)."""

from __future__ import annotations

import datetime as dt
import math
from typing import NamedTuple

from flask import abort, current_app, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required
from sqlalchemy import case, func, select, union_all
from sqlalchemy.orm import load_only

from dashboard.accounts import access
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.models import (
    Attempt,
    Delivery,
    DeliveryState,
    Incident,
    IncidentState,
    OutcomeCount,
    Subscription,
    SubscriptionState,
    Team,
)
from dashboard.operations import incident_rules, incidents, notifications, subscription_status
from dashboard.stats import outcomes
from dashboard.subscriptions import service as subscription_service
from dashboard.web.auth import is_local_path
from dashboard.web.pages import bp
from dashboard.web.pages.formatting import utc
from dashboard.web.pages.replays import failing_note

LIST_LIMIT = 200
# The evidence shown: the last distinct failures, the dead letters in the window (a replay takes them all).
ERRORS_SHOWN = 10
ERROR_CANDIDATES = 200  # per delivery state: the newest deliveries whose attempts are read for them
DEAD_SHOWN = 100
REPLAY_LIMIT = 10_000
# The chart: per minute from before the incident to now (or its resolution), in at most this many bars.
CHART_BARS = 120
CHART_BEFORE = dt.timedelta(minutes=30)


def incident_or_404(incident_id: str) -> Incident:
    incident = db.session.get(Incident, incident_id)
    if incident is None or not access.can_view_team(current_user, incident.team_id):
        abort(404)  # another team's incident does not exist, as far as they can tell
    return incident


@bp.get("/incidents", endpoint="incidents")  # the nav bar links to pages.incidents
@login_required
def incidents_list():
    state = request.args.get("state")
    team = request.args.get("team") or None  # a grouped notification links to one team's list
    query = access.restrict(select(Incident), current_user, Incident.team_id)
    if state in IncidentState.ALL:
        query = query.where(Incident.state == state)
    if team is not None:
        query = query.where(Incident.team_id == select(Team.id).where(Team.name == team).scalar_subquery())
    # Open first, then acknowledged, then resolved; newest first within each.
    order = case({IncidentState.OPEN: 0, IncidentState.ACKNOWLEDGED: 1}, value=Incident.state, else_=2)
    rows = db.session.scalars(query.order_by(order, Incident.opened_at.desc()).limit(LIST_LIMIT)).all()
    urls = {sub.id: sub.target for sub in db.session.scalars(
        select(Subscription).options(load_only(Subscription.url, Subscription.mode, Subscription.listen_seen_at))
        .where(Subscription.id.in_({i.subscription_id for i in rows if i.subscription_id})))}
    teams = dict(db.session.execute(select(Team.id, Team.name).where(
        Team.id.in_({i.team_id for i in rows if i.team_id is not None}))).all())
    # Every rule firing on the same subscription now: one outage may fire several.
    firing = {}
    for i in rows:
        if i.resolved_at is None:
            firing.setdefault(i.subscription_id, []).append(i.rule)
    return render_template("incidents/page.html", incidents=rows, urls=urls, teams=teams, firing=firing,
                           state=state, team=team, rule_title=incident_rules.title, now=current_app.config["CLOCK"].now(),
                           describe=incidents.describe_figures, duration=duration)


def duration(incident: Incident, now: dt.datetime) -> str:
    """How long it has lasted (from its first sign to its resolution, or now), in words: "2 h 5 min"."""
    minutes = int(((incident.resolved_at or now) - incident.first_seen_at).total_seconds() // 60)
    if minutes < 60:
        return f"{max(minutes, 0)} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours // 24} days {hours % 24} h"


SNOOZE_CHOICES = [(1, "1 hour"), (4, "4 hours"), (12, "12 hours"), (24, "24 hours"), (72, "3 days")]


def evidence_window(incident: Incident, setting) -> tuple[dt.datetime, dt.datetime]:
    """From a window before the first sign to the resolution (or now). It starts on a minute, as outcomes are
    counted, so the dead letters listed and those counted cover the same time."""
    return (outcomes.minute_of(incident.first_seen_at - dt.timedelta(minutes=setting.window_minutes)),
            incident.resolved_at or current_app.config["CLOCK"].now())


def chart(sub_id: str, incident: Incident) -> tuple[list[outcomes.Bucket], int, list[tuple[int, str]]]:
    """Buckets of successes, failures and dead letters around the incident, their width in minutes,
    and where it opened and resolved (bucket index, label)."""
    now = current_app.config["CLOCK"].now()
    start = outcomes.minute_of(min(incident.first_seen_at, incident.opened_at) - CHART_BEFORE)
    end = incident.resolved_at or now
    minutes = max(1, math.ceil((end - start).total_seconds() / 60 / CHART_BARS))
    buckets = outcomes.series(db.session, [sub_id], start, end, bucket_seconds=60 * minutes)[sub_id]
    width = dt.timedelta(minutes=minutes)
    marks = [(i, label) for label, at in (("opened", incident.opened_at), ("resolved", incident.resolved_at))
             for i, b in enumerate(buckets) if at is not None and b.start <= at < b.start + width]
    return buckets, minutes, marks


def last_errors(sub_id: str, since: dt.datetime, until: dt.datetime) -> list:
    """The last distinct failures (status, error, response excerpt) of the window, newest first.
    Attempts are read by delivery: those of the subscription's newest deliveries created by the end of
    the window, a bounded number in each state through the (subscription, state, created_at) index, so
    the evidence stays after a replay (when they are pending or succeeded again)."""
    newest = [select(per_state.c.id) for per_state in (
        select(Delivery.id).where(Delivery.subscription_id == sub_id, Delivery.state == state,
                                  Delivery.created_at <= until)
        .order_by(Delivery.created_at.desc()).limit(ERROR_CANDIDATES).subquery()
        for state in DeliveryState.ALL)]
    failed = (Attempt.status_code.is_(None)) | (Attempt.status_code < 200) | (Attempt.status_code >= 300) \
        | Attempt.error.is_not(None)
    return db.session.execute(
        select(Attempt.status_code, Attempt.error, Attempt.response_excerpt,
               func.max(Attempt.attempted_at).label("last"), func.count().label("times"))
        .where(Attempt.delivery_id.in_(union_all(*newest)), Attempt.attempted_at >= since,
               Attempt.attempted_at <= until, failed)
        .group_by(Attempt.status_code, Attempt.error, Attempt.response_excerpt)
        .order_by(func.max(Attempt.attempted_at).desc()).limit(ERRORS_SHOWN)).all()


def dead_in_window(sub_id: str, since: dt.datetime, until: dt.datetime):
    return (select(Delivery).where(Delivery.subscription_id == sub_id, Delivery.state == DeliveryState.DEAD,
                                   Delivery.dead_lettered_at >= since, Delivery.dead_lettered_at <= until)
            .order_by(Delivery.dead_lettered_at.desc()))


class DeadLetterCounts(NamedTuple):
    """The deliveries dead-lettered in a window, and what became of them."""
    lettered: int
    still_dead: int
    discarded: int

    @property
    def replayed(self) -> int:
        return self.lettered - self.still_dead - self.discarded


def dead_letter_counts(sub_id: str, since: dt.datetime, until: dt.datetime) -> DeadLetterCounts:
    """Outcome counts keep every dead-lettering, while a replay clears the delivery's dead_lettered_at."""
    lettered = db.session.scalar(select(func.coalesce(func.sum(OutcomeCount.dead), 0)).where(
        OutcomeCount.subscription_id == sub_id, OutcomeCount.minute >= since, OutcomeCount.minute <= until))
    still_dead, discarded = (db.session.scalar(select(func.count()).select_from(Delivery).where(
        Delivery.subscription_id == sub_id, Delivery.state == state, Delivery.dead_lettered_at >= since,
        Delivery.dead_lettered_at <= until)) for state in (DeliveryState.DEAD, DeliveryState.DISCARDED))
    return DeadLetterCounts(max(int(lettered), still_dead + discarded), still_dead, discarded)


def still_dead_of_figures(sub_id: str, incident: Incident) -> int | None:
    """Of the dead letters its figures count (their window, up to when the rule was last seen true), those still
    dead: the same window as the figure it stands beside."""
    minutes = (incident.figures or {}).get("window_minutes")
    if "dead" not in (incident.figures or {}) or not minutes:
        return None
    since = outcomes.minute_of(incident.last_seen_at - dt.timedelta(minutes=minutes))
    return db.session.scalar(select(func.count()).select_from(
        dead_in_window(sub_id, since, incident.last_seen_at).subquery()))


def snooze_options(inc: Incident, now: dt.datetime) -> list[tuple[int, str]]:
    """The snooze choices, each saying when it would end and, over a running snooze, whether it shortens it."""
    running = inc.snoozed_until if incidents.snoozed(inc, now) else None
    options = []
    for hours, label in SNOOZE_CHOICES:
        until = now + dt.timedelta(hours=hours)
        change = "until" if running in (None, until) else ("shortens it to" if until < running else "lengthens it to")
        options.append((hours, f"{label}: {change} {utc(until)} UTC"))
    return options


def audit_url(sub_id: str) -> str:
    if "pages.audit" in current_app.view_functions:
        return url_for("pages.audit", subscription=sub_id)
    return f"/audit?subscription={sub_id}"  # the audit page's stable address


@bp.get("/incidents/<incident_id>")
@login_required
def incident(incident_id):
    inc = incident_or_404(incident_id)
    setting = incident_rules.setting_of(inc)
    sub = db.session.get(Subscription, inc.subscription_id) if inc.subscription_id else None
    may_act = access.can_acknowledge(current_user, inc.team_id)
    now = current_app.config["CLOCK"].now()
    context = {"inc": inc, "sub": sub, "setting": setting, "title": incident_rules.title(inc.rule),
               "can_acknowledge": may_act and inc.state == IncidentState.OPEN,
               "can_snooze": may_act and inc.resolved_at is None, "snoozed": incidents.snoozed(inc, now),
               "can_end_snooze": may_act, "snooze_options": snooze_options(inc, now), "now": now,
               "duration": duration(inc, now), "figures": incidents.describe_figures(inc),
               "rules_seen": incidents.rules_last_seen(inc)}
    if sub is not None:
        since, until = evidence_window(inc, setting)
        dead_query = dead_in_window(sub.id, since, until)
        buckets, bucket_minutes, marks = chart(sub.id, inc)
        context.update(
            since=since, until=until, buckets=buckets, bucket_minutes=bucket_minutes, marks=marks,
            errors=last_errors(sub.id, since, until),
            dead=db.session.scalars(dead_query.limit(DEAD_SHOWN)).all(),
            dead_counts=dead_letter_counts(sub.id, since, until),
            figures=incidents.describe_figures(inc, still_dead=still_dead_of_figures(sub.id, inc)),
            can_operate=access.can_operate(current_user, sub), audit_url=audit_url(sub.id))
        if context["can_operate"] and context["dead_counts"].still_dead:
            context["replay_warning"] = failing_note(subscription_status.status(sub, now), now)
    return render_template("incidents/incident.html", **context)


def _subscription_of(inc: Incident, need) -> Subscription:
    sub = db.session.get(Subscription, inc.subscription_id) if inc.subscription_id else None
    if sub is None:
        abort(404)  # Promesa's own incidents (backlog) have no subscription to act on
    access.require(need(current_user, sub))
    return sub


def _to_act_on(incident_id: str) -> Incident:
    """The incident, if this user may acknowledge, snooze and resolve it (404 / 403 otherwise)."""
    inc = incident_or_404(incident_id)
    access.require(access.can_acknowledge(current_user, inc.team_id))
    return inc


def _told(inc: Incident, message: str):
    flash(message, "ok")
    return redirect(url_for(".incident", incident_id=inc.id))


def _sinks_told(done: str, inc: Incident, sinks_told: int, about: str = "") -> str:
    """What was done, and which sinks will hear of it (their deliveries are queued), or why none will."""
    if sinks_told:
        return f"{done}: {sinks_told} notification sink{'s' if sinks_told != 1 else ''} will be told{about}."
    if incidents.snoozed(inc):
        return f"{done}. No notification sink will be told: it is snoozed until {utc(inc.snoozed_until)} UTC."
    configured = len(notifications.sinks())
    if not configured:
        return f"{done}. No notification sink is configured, so none will be told; an admin can add one under Sinks."
    return (f"{done}. None of the {configured} notification sink{'s' if configured != 1 else ''} is set to hear "
            "about this incident, so none will be told.")


@bp.post("/incidents/<incident_id>/acknowledge")
@login_required
def acknowledge_incident(incident_id):
    # Acknowledging says "someone is on it": the sinks hear it (with the note), nothing else changes.
    inc = _to_act_on(incident_id)
    try:
        sinks_told = incidents.acknowledge(inc, current_user.email, request.form.get("note", ""))
    except ApiError as exc:
        abort(exc.status, f"Not acknowledged: {exc.message}.")
    if sinks_told is None:
        return _told(inc, f"Already {inc.state}.")
    return _told(inc, _sinks_told("Acknowledged", inc, sinks_told, about=" you are on it"))


@bp.post("/incidents/<incident_id>/snooze")
@login_required
def snooze_incident(incident_id):
    # Quiet, not gone: no notifications until then; it stays listed and still resolves by itself.
    inc = _to_act_on(incident_id)
    hours = request.form.get("hours", "")
    if hours not in {str(h) for h, _ in SNOOZE_CHOICES}:
        abort(400, "Choose how long to snooze from the list.")
    until = current_app.config["CLOCK"].now() + dt.timedelta(hours=int(hours))
    try:
        was_until = incidents.snooze(inc, current_user.email, until)
    except ApiError as exc:
        abort(exc.status, f"Not snoozed: {exc.message}.")
    quiet = "no notifications about it until then."
    if was_until in (None, until):
        return _told(inc, f"Snoozed until {utc(until)} UTC: {quiet}")
    change = "shortened" if until < was_until else "lengthened"
    return _told(inc, f"Snooze {change}: until {utc(until)} UTC (it was until {utc(was_until)} UTC); {quiet}")


@bp.post("/incidents/<incident_id>/unsnooze")
@login_required
def end_incident_snooze(incident_id):
    # Whoever may snooze may end a snooze early: notifications about it (and its cause's return) resume.
    inc = _to_act_on(incident_id)
    if not incidents.end_snooze(inc):
        return _told(inc, "It is not snoozed: nothing to end.")
    if inc.resolved_at is not None:
        return _told(inc, "Snooze ended: if its cause returns, the new incident is notified.")
    return _told(inc, "Snooze ended: notifications about it resume now.")


@bp.post("/incidents/<incident_id>/resolve")
@login_required
def resolve_incident(incident_id):
    # By hand: the cause is fixed or it was noise; if the rule still fires, a new incident opens.
    inc = _to_act_on(incident_id)
    sinks_told = incidents.resolve(inc, current_user.email)
    if sinks_told is None:
        return _told(inc, "Already resolved.")
    return _told(inc, _sinks_told("Resolved", inc, sinks_told)
                 + " If its rule still fires, the next check opens a new incident.")


@bp.post("/incidents/<incident_id>/replay")
@login_required
def replay_incident(incident_id):
    # Replay the dead letters of the incident's window (or the ones ticked among them).
    inc = incident_or_404(incident_id)
    sub = _subscription_of(inc, access.can_operate)
    since, until = evidence_window(inc, incident_rules.setting_of(inc))
    ids = db.session.scalars(dead_in_window(sub.id, since, until).with_only_columns(Delivery.id)
                             .limit(REPLAY_LIMIT)).all()
    ticked = set(request.form.getlist("delivery_id"))
    if ticked:
        ids = [i for i in ids if i in ticked]  # only dead letters of this window, whatever was posted
    if not ids:
        flash("No dead letters in this incident's window to replay.", "ok")
    else:
        n = subscription_service.replay(sub, delivery_ids=ids)
        held = " (held while the subscription is not active)" if sub.state != SubscriptionState.ACTIVE else ""
        flash(f"Replaying {n} dead letters{held}.", "ok")
    return redirect(url_for(".incident", incident_id=inc.id))


@bp.post("/incidents/<incident_id>/pause")
@login_required
def pause_from_incident(incident_id):
    # Pausing holds deliveries instead of failing them while the receiver is repaired.
    inc = incident_or_404(incident_id)
    sub = _subscription_of(inc, access.can_operate)
    if sub.state == SubscriptionState.ACTIVE:
        subscription_service.pause(sub, f"paused by {current_user.email} from incident {inc.id}")
        flash("Paused: new deliveries are held until you resume.", "ok")
    else:
        flash(f"The subscription is already {sub.state}.", "ok")
    return redirect(url_for(".incident", incident_id=inc.id))


@bp.post("/subscriptions/<subscription_id>/rules/<rule>")
@login_required
def save_incident_rule(subscription_id, rule):
    # Owners and admins tune when their subscription's incidents open.
    sub = access.visible_subscription(subscription_id, need=access.can_edit)
    back = _back_to(sub)  # decided before anything is saved
    try:
        setting = incident_rules.save_rule(sub, rule, request.form, current_user.email)
    except ValueError as exc:
        abort(400, f"Not saved: {exc}. Nothing was changed.")
    flash(f"Saved: {rule} opens an incident when {setting.describe()}." if setting.enabled
          else f"Saved: {rule} is off: it opens no incident.", "ok")
    return redirect(back)


def _back_to(sub: Subscription) -> str:
    """Back where the form was (an incident page or the subscription page), never off-site."""
    came_from = request.form.get("back", "")
    if came_from.startswith("/incidents/") and is_local_path(came_from):
        return came_from
    return url_for(".subscription", subscription_id=sub.id)


@bp.app_context_processor
def _incident_helpers():
    def rules_of(sub):
        return [(incident_rules.TITLES[name], s) for name, s in incident_rules.settings_for([sub.id])[sub.id].items()]

    return {"open_incident_count": lambda: incidents.open_count(current_user),
            "incident_rules": rules_of,
            "can_edit_rules": lambda sub: access.can_edit(current_user, sub),
            "rule_limits": incident_rules.LIMITS}
