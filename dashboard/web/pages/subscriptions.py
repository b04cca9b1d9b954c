"""A subscription's page, its contract, and the buttons that repair it."""

from __future__ import annotations

import dataclasses
import datetime as dt

from flask import abort, current_app, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required
from sqlalchemy import select

from dashboard.accounts import access
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError, parse_time
from dashboard.delivery import failures
from dashboard.models import AuditEntry, Delivery, DeliveryState, ReplayKind, Subscription, SubscriptionState, Team
from dashboard.operations import replays as replay_service
from dashboard.operations import subscription_status
from dashboard.stats import latency, outcomes, rollup
from dashboard.subscriptions import client_tls
from dashboard.subscriptions import contract as contract_service
from dashboard.subscriptions import service as subscription_service
from dashboard.web.pages import both, bp
from dashboard.web.pages.replays import failing_note, held_note, show_started

PAGE = 50
AUDIT_ENTRIES = 20


@dataclasses.dataclass(frozen=True)
class Window:
    """A chart's window: how far back, in buckets of how long, labelled how often and how."""
    name: str
    title: str
    span: dt.timedelta
    bucket_seconds: int
    label_every: int
    label_format: str


WINDOWS = {w.name: w for w in (
    Window("1h", "last hour, per minute", dt.timedelta(hours=1), 60, 10, "%H:%M"),
    Window("24h", "last 24 hours, per 15 minutes", dt.timedelta(hours=24), 900, 16, "%H:%M"),
    Window("7d", "last 7 days, per hour", dt.timedelta(days=7), 3600, 24, "%b %d"),
)}
DEFAULT_WINDOW = "24h"


def chart_window() -> Window:
    name = request.args.get("window") or DEFAULT_WINDOW
    if name not in WINDOWS:
        abort(400, f"window must be one of: {', '.join(WINDOWS)}")
    return WINDOWS[name]


def chart_data(sub, window: Window, now: dt.datetime):
    """The window's outcome buckets (ending with the one now is in) and their latency percentiles."""
    if window.bucket_seconds == 3600:  # whole hours: read the rolled-up hours
        buckets = rollup.hourly(db.session, [sub.id], now - window.span + dt.timedelta(hours=1), now)[sub.id]
    else:
        step = dt.timedelta(seconds=window.bucket_seconds)
        buckets = outcomes.series(db.session, [sub.id], now - window.span + step,
                                  outcomes.minute_of(now) + dt.timedelta(minutes=1), window.bucket_seconds)[sub.id]
    until = buckets[-1].start + dt.timedelta(seconds=window.bucket_seconds)
    lat, cut = latency.per_bucket(db.session, sub.id, [b.start for b in buckets], window.bucket_seconds, until,
                                  sub.max_age_seconds)
    return buckets, lat, cut


def _filters() -> dict:
    """The delivery list's filters from the query string; a malformed one is a 400 that says so. `args`: the
    filters but the state, as the page's links carry them."""
    state = request.args.get("state") or None
    if state is not None and state not in DeliveryState.ALL:
        abort(400, f"state must be one of: {', '.join(DeliveryState.ALL)}")
    status = (request.args.get("status") or "").strip()
    if status and not (status.isdigit() and 100 <= int(status) <= 599):
        abort(400, "status must be an HTTP status code, from 100 to 599")
    since, until = _time("from"), _time("to")
    if since and until and since >= until:
        abort(400, "from must be before to")
    event_type = (request.args.get("type") or "").strip()[:200] or None
    args = {"type": event_type, "status": int(status) if status else None, "from": _shown(since),
            "to": _shown(until)}
    return {"state": state, "event_type": event_type, "status_code": args["status"], "since": since,
            "until": until, "args": {k: v for k, v in args.items() if v is not None}}


def _time(name: str) -> dt.datetime | None:
    """A time bound of the delivery list (a datetime-local input's value: UTC); 400 unless it is a time."""
    try:
        return parse_time((request.args.get(name) or "").strip()[:64], name)
    except ApiError as exc:  # unreadable (400) or past year 9999 in UTC (422): the same mistake in a form
        abort(400, f"{exc.message} (a date and a time in UTC, such as 2026-11-30T09:00)")


def _shown(when: dt.datetime | None) -> str | None:
    """A bound as the datetime-local input shows it back (seconds only when it has some)."""
    if when is None:
        return None
    return when.strftime("%Y-%m-%dT%H:%M:%S" if when.second or when.microsecond else "%Y-%m-%dT%H:%M")


@both("/subscriptions/<subscription_id>", methods=["GET"])
@login_required
def subscription(subscription_id):
    sub = access.visible_subscription(subscription_id)
    filters = _filters()
    page, next_before = subscription_service.deliveries_page(
        sub, filters["state"], request.args.get("before"), PAGE,
        event_type=filters["event_type"], status_code=filters["status_code"], since=filters["since"],
        until=filters["until"])
    window = chart_window()
    now = current_app.config["CLOCK"].now()
    buckets, lat, latency_cut = chart_data(sub, window, now)
    # The audit log names the team's users (their emails): never in the portal.
    entries = [] if access.is_portal(current_user) else db.session.scalars(
        select(AuditEntry).where(AuditEntry.subscription_id == sub.id)
        .order_by(AuditEntry.at.desc(), AuditEntry.id.desc()).limit(AUDIT_ENTRIES)).all()
    status = subscription_status.status(sub, now)
    return render_template("subscriptions/page.html", sub=sub, deliveries=page, filters=filters,
                           state=filters["state"], next_before=next_before, buckets=buckets, latency=lat,
                           latency_cut=latency_cut, window=window, windows=WINDOWS, audit_entries=entries,
                           status=status, replay_warning=failing_note(status, now), now=now,
                           error_class=failures.words,
                           can_operate=access.can_operate(current_user, sub))


@both("/subscriptions/<subscription_id>/contract", methods=["GET"])
@login_required
def contract(subscription_id):
    sub = access.visible_subscription(subscription_id)
    return render_template("subscriptions/contract.html", c=contract_service.build(sub), sub=sub)


@bp.app_template_global()
def client_certificate(sub: Subscription) -> dict | None:
    """What pages show of a subscription's client certificate (never its key)."""
    return client_tls.view_of(sub)


@bp.app_template_global()
def client_certificate_warning(sub: Subscription) -> str | None:
    """From 14 days before its client certificate ends, the warning its pages show (by the app's clock)."""
    return client_tls.expiry_warning(sub, current_app.config["CLOCK"].now())


@bp.app_template_global()
def shown_actor(name: str, kind: str | None = None) -> str:
    """Who did something (an audit entry's actor and kind, a check's requester), as the page may say it: on the
    dashboard as recorded; in the portal "you" for its consumer, "Promesa" for the system, and the producing team's
    name for anyone else (a user's email or a token's prefix is the team's business, not its consumer's)."""
    if request.blueprint != "portal":
        return name
    if kind in (None, "portal") and name == current_user.uid:
        return "you"
    if kind == "system":
        return "Promesa"
    return db.session.get(Team, current_user.team_id).name


def deliveries(n: int, which: str) -> str:
    """ "no waiting deliveries", "1 waiting delivery", "3 waiting deliveries": a count a flash can say."""
    return f"{n or 'no'} {which} deliver{'y' if n == 1 else 'ies'}"


def held_words(held: int, until: str) -> str:
    if not held:
        return f"no deliveries were waiting; new ones are held until {until}."
    return f"{deliveries(held, 'waiting')} {'is' if held == 1 else 'are'} held, and new ones too, until {until}."


def released_words(released: int) -> str:
    if not released:
        return "nothing was held; new deliveries are sent as they come."
    return f"{deliveries(released, 'held')} {'is on its' if released == 1 else 'are on their'} way."


@both("/subscriptions/<subscription_id>/pause", methods=["POST"])
@login_required
def pause(subscription_id):
    # Pausing holds deliveries instead of failing them while a receiver is being repaired.
    sub = access.visible_subscription(subscription_id, need=access.can_operate)
    try:
        held = subscription_service.pause(sub, request.form.get("reason"))
    except ApiError as exc:
        abort(exc.status, exc.message)
    flash(f"Paused: {held_words(held, 'you resume')}", "ok")
    return redirect(url_for(".subscription", subscription_id=sub.id))


@both("/subscriptions/<subscription_id>/resume", methods=["POST"])
@login_required
def resume(subscription_id):
    # Resuming releases every held delivery at once.
    sub = access.visible_subscription(subscription_id, need=access.can_operate)
    if sub.state == SubscriptionState.DISABLED and sub.deleted_at is None:  # deleted: the service says so
        abort(409, "This subscription is disabled: enable it (its reason says why it was stopped).")
    released = subscription_service.resume(sub)
    flash(f"Resumed: {released_words(released)}", "ok")
    return redirect(url_for(".subscription", subscription_id=sub.id))


@both("/subscriptions/<subscription_id>/replay", methods=["POST"])
@login_required
def replay(subscription_id):
    # Replay all dead letters, or re-send one delivery (dead or succeeded), with a fresh retry schedule.
    sub = access.visible_subscription(subscription_id, need=access.can_operate)
    delivery_id = request.form.get("delivery_id")
    if delivery_id:  # another subscription's delivery is not there to re-send, as far as this page can tell
        access.of_subscription(Delivery, delivery_id, sub)
    elif access.is_portal(current_user):
        # A consumer replays its endpoint's dead letters as the dead-letter desk does: a job, with progress.
        subscription_service.not_deleted(sub)
        dead = replay_service.DeadLetterFilter(subscription_id=sub.id, team_id=sub.team_id)
        if replay_service.count(dead.where()):
            return show_started(*replay_service.start(dead, ReplayKind.REPLAY))
        flash("Nothing to replay: this subscription has no dead letters.", "ok")
        return redirect(url_for(".subscription", subscription_id=sub.id))
    n = subscription_service.replay(sub, delivery_ids=[delivery_id] if delivery_id else None)
    if not n:
        flash("Nothing re-sent: this delivery is neither dead nor succeeded." if delivery_id else
              "Nothing to replay: this subscription has no dead letters.", "ok")
    else:
        flash(("Re-sending this delivery." if delivery_id else f"Replaying {deliveries(n, 'dead')}.")
              + held_note(sub.id), "ok")
    target = url_for(".delivery", delivery_id=delivery_id) if delivery_id else \
        url_for(".subscription", subscription_id=sub.id)
    return redirect(target)


@bp.post("/subscriptions/<subscription_id>/disable")
@login_required
def disable(subscription_id):
    # A stronger pause, with a reason everyone who opens the page reads; only "enable" ends it.
    sub = access.visible_subscription(subscription_id, need=access.can_operate)
    try:
        held = subscription_service.disable(sub, request.form.get("reason", ""))
    except ApiError as exc:
        abort(exc.status, exc.message)
    flash(f"Disabled: {held_words(held, 'someone enables it')}", "ok")
    return redirect(url_for(".subscription", subscription_id=sub.id))


@bp.post("/subscriptions/<subscription_id>/enable")
@login_required
def enable(subscription_id):
    # Enabling is a resume: every held delivery is released at once.
    sub = access.visible_subscription(subscription_id, need=access.can_operate)
    released = subscription_service.enable(sub)
    flash(f"Enabled: {released_words(released)}", "ok")
    return redirect(url_for(".subscription", subscription_id=sub.id))


def _delivery_ids() -> list[str] | None:
    """The delivery named by the form (a button on a delivery's page), or None: all that match."""
    delivery_id = (request.form.get("delivery_id") or "").strip()
    return [delivery_id] if delivery_id else None


@bp.post("/subscriptions/<subscription_id>/discard")
@login_required
def discard(subscription_id):
    # Dead letters that will never be delivered end discarded, as a job with progress; they stay readable.
    sub = access.visible_subscription(subscription_id, need=access.can_operate)
    subscription_service.not_deleted(sub)
    ids = _delivery_ids()
    dead = replay_service.DeadLetterFilter(subscription_id=sub.id, team_id=sub.team_id,
                                           delivery_ids=tuple(ids or ()))
    return show_started(*replay_service.start(dead, ReplayKind.DISCARD))


@bp.post("/subscriptions/<subscription_id>/give-up")
@login_required
def give_up(subscription_id):
    # A hopeless retry schedule ends now: the scheduled deliveries become dead letters at once.
    sub = access.visible_subscription(subscription_id, need=access.can_operate)
    ids = _delivery_ids()
    n = subscription_service.give_up(sub, ids)
    if not n:
        flash("Nothing to give up on: no delivery was scheduled for a retry.", "ok")
    else:
        flash(f"Gave up on {deliveries(n, 'scheduled')}: {'it is a dead letter' if n == 1 else 'they are dead letters'}"
              " now (replay or discard them).", "ok")
    return redirect(url_for(".delivery", delivery_id=ids[0]) if ids else url_for(".subscription",
                                                                               subscription_id=sub.id))
