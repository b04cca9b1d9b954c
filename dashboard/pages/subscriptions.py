"""A subscription's page, its contract, and the buttons that repair it."""

from __future__ import annotations

from flask import flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from .. import access
from .. import contract as contract_service
from .. import subscriptions as subscription_service
from ..models import DeliveryState
from . import bp

PAGE = 50


@bp.get("/subscriptions/<subscription_id>")
@login_required
def subscription(subscription_id):
    sub = access.subscription_or_404(subscription_id)
    state = request.args.get("state")
    if state not in DeliveryState.ALL:
        state = None
    page, next_before = subscription_service.deliveries_page(sub, state, request.args.get("before"), PAGE)
    return render_template("subscriptions/page.html", sub=sub, deliveries=page, state=state,
                           next_before=next_before, can_operate=access.can_operate(current_user, sub))


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
