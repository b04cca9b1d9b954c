"""A subscription's page, its contract, and the buttons that repair it."""

from __future__ import annotations

import datetime as dt

from flask import abort, current_app, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required
from sqlalchemy import select

from .. import access, rollup
from .. import contract as contract_service
from .. import subscriptions as subscription_service
from ..extensions import db
from ..models import AuditEntry, DeliveryState, SubscriptionState
from ..validation import ApiError
from . import bp

PAGE = 50
CHART_DAYS = 7
AUDIT_ENTRIES = 20


def _filters() -> dict:
    """The delivery list's filters from the query string; a malformed one is a 400 that says so."""
    state = request.args.get("state") or None
    if state is not None and state not in DeliveryState.ALL:
        abort(400, f"state must be one of: {', '.join(DeliveryState.ALL)}")
    status = (request.args.get("status") or "").strip()
    if status and not (status.isdigit() and 100 <= int(status) <= 599):
        abort(400, "status must be an HTTP status code, from 100 to 599")
    return {"state": state, "event_type": (request.args.get("type") or "").strip()[:200] or None,
            "status_code": int(status) if status else None}


@bp.get("/subscriptions/<subscription_id>")
@login_required
def subscription(subscription_id):
    sub = access.subscription_or_404(subscription_id)
    filters = _filters()
    page, next_before = subscription_service.deliveries_page(
        sub, filters["state"], request.args.get("before"), PAGE,
        event_type=filters["event_type"], status_code=filters["status_code"])
    now = current_app.config["CLOCK"].now()
    week = rollup.hourly(db.session, [sub.id], now - dt.timedelta(days=CHART_DAYS), now)[sub.id]
    entries = db.session.scalars(select(AuditEntry).where(AuditEntry.subscription_id == sub.id)
                                 .order_by(AuditEntry.at.desc(), AuditEntry.id.desc()).limit(AUDIT_ENTRIES)).all()
    return render_template("subscriptions/page.html", sub=sub, deliveries=page, filters=filters,
                           state=filters["state"], next_before=next_before, week=week, audit_entries=entries,
                           chart_days=CHART_DAYS, can_operate=access.can_operate(current_user, sub))


@bp.get("/subscriptions/<subscription_id>/contract")
@login_required
def contract(subscription_id):
    sub = access.subscription_or_404(subscription_id)
    return render_template("subscriptions/contract.html", c=contract_service.build(sub), sub=sub)


@bp.post("/subscriptions/<subscription_id>/pause")
@login_required
def pause(subscription_id):
    # Pausing holds deliveries instead of failing them while a receiver is being repaired.
    sub = access.subscription_or_404(subscription_id, need=access.can_operate)
    subscription_service.pause(sub, f"paused by {current_user.email}")
    flash("Paused: new deliveries are held until you resume.", "ok")
    return redirect(url_for(".subscription", subscription_id=sub.id))


@bp.post("/subscriptions/<subscription_id>/resume")
@login_required
def resume(subscription_id):
    # Resuming releases every held delivery at once.
    sub = access.subscription_or_404(subscription_id, need=access.can_operate)
    if sub.state == SubscriptionState.DISABLED and sub.deleted_at is None:  # deleted: the service says so
        abort(409, "This subscription is disabled: enable it (its reason says why it was stopped).")
    released = subscription_service.resume(sub)
    flash(f"Resumed: {released} held deliveries are on their way.", "ok")
    return redirect(url_for(".subscription", subscription_id=sub.id))


@bp.post("/subscriptions/<subscription_id>/replay")
@login_required
def replay(subscription_id):
    # Replay all dead letters, or re-send one delivery (dead or succeeded), with a fresh retry schedule.
    sub = access.subscription_or_404(subscription_id, need=access.can_operate)
    delivery_id = request.form.get("delivery_id")
    n = subscription_service.replay(sub, delivery_ids=[delivery_id] if delivery_id else None)
    flash("Re-sending this delivery." if delivery_id and n else f"Replaying {n} dead deliveries.", "ok")
    target = url_for(".delivery", delivery_id=delivery_id) if delivery_id else \
        url_for(".subscription", subscription_id=sub.id)
    return redirect(target)


@bp.post("/subscriptions/<subscription_id>/disable")
@login_required
def disable(subscription_id):
    # A stronger pause, with a reason everyone who opens the page reads; only "enable" ends it.
    sub = access.subscription_or_404(subscription_id, need=access.can_operate)
    try:
        held = subscription_service.disable(sub, request.form.get("reason", ""))
    except ApiError as exc:
        abort(exc.status, exc.message)
    flash(f"Disabled: {held} waiting deliveries are held until someone enables it.", "ok")
    return redirect(url_for(".subscription", subscription_id=sub.id))


@bp.post("/subscriptions/<subscription_id>/enable")
@login_required
def enable(subscription_id):
    # Enabling is a resume: every held delivery is released at once.
    sub = access.subscription_or_404(subscription_id, need=access.can_operate)
    released = subscription_service.enable(sub)
    flash(f"Enabled: {released} held deliveries are on their way.", "ok")
    return redirect(url_for(".subscription", subscription_id=sub.id))
