"""The operator dashboard: server-rendered pages; state changes are POST-only with CSRF."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required
from sqlalchemy import func, select

from . import contract as contract_service
from . import subscriptions as subscription_service
from .auth import GLOBAL_ROLES, can_operate, can_view
from .extensions import db
from .models import Delivery, DeliveryState, Subscription
from .validation import nul_in_path_or_query

bp = Blueprint("views", __name__)
PAGE = 50
OPEN_STATES = (DeliveryState.PENDING, DeliveryState.SCHEDULED, DeliveryState.HELD, DeliveryState.DEAD)


@bp.before_request
def refuse_nul():
    if nul_in_path_or_query(request):
        abort(400, "the path and the query must not contain NUL characters")


def _visible_subscriptions():
    query = select(Subscription).order_by(Subscription.created_at.desc())
    if current_user.role not in GLOBAL_ROLES:
        query = query.where(Subscription.team_id == (current_user.team_id or -1))
    return db.session.scalars(query).all()


def _subscription_or_404(subscription_id: str, operate: bool = False) -> Subscription:
    sub = db.session.get(Subscription, subscription_id)
    if sub is None or not can_view(current_user, sub):
        abort(404)  # another team's subscription does not exist, as far as you can tell
    if operate and not can_operate(current_user, sub):
        abort(403)
    return sub


@bp.get("/")
@login_required
def index():
    subs = _visible_subscriptions()
    counts: dict[str, dict[str, int]] = {s.id: {} for s in subs}
    if subs:
        # Only the states that mean "not delivered yet": succeeded rows grow without bound, these stay small.
        rows = db.session.execute(
            select(Delivery.subscription_id, Delivery.state, func.count())
            .where(Delivery.subscription_id.in_(list(counts)), Delivery.state.in_(OPEN_STATES))
            .group_by(Delivery.subscription_id, Delivery.state)).all()
        for sub_id, state, n in rows:
            counts[sub_id][state] = n
    # htmx polls this route for the table alone; a normal request gets the whole page.
    template = "views/_subscriptions.html" if request.headers.get("HX-Request") else "views/index.html"
    return render_template(template, subscriptions=subs, counts=counts)


@bp.get("/subscriptions/<subscription_id>")
@login_required
def subscription(subscription_id):
    sub = _subscription_or_404(subscription_id)
    state = request.args.get("state")
    if state not in DeliveryState.ALL:
        state = None
    page, next_before = subscription_service.deliveries_page(sub, state, request.args.get("before"), PAGE)
    return render_template("views/subscription.html", sub=sub, deliveries=page, state=state,
                           next_before=next_before, can_operate=can_operate(current_user, sub))


@bp.get("/subscriptions/<subscription_id>/contract")
@login_required
def contract(subscription_id):
    sub = _subscription_or_404(subscription_id)
    return render_template("views/contract.html", c=contract_service.build(sub), sub=sub)


@bp.get("/deliveries/<delivery_id>")
@login_required
def delivery(delivery_id):
    d = db.session.get(Delivery, delivery_id)
    if d is None or not can_view(current_user, d.subscription):
        abort(404)
    return render_template("views/delivery.html", d=d, sub=d.subscription,
                           can_operate=can_operate(current_user, d.subscription))


@bp.post("/subscriptions/<subscription_id>/pause")
@login_required
def pause(subscription_id):
    # Pausing holds deliveries instead of failing them while a receiver is being repaired.
    sub = _subscription_or_404(subscription_id, operate=True)
    subscription_service.pause(sub, f"paused by {current_user.email}")
    flash("Paused: new deliveries are held until you resume.", "ok")
    return redirect(url_for(".subscription", subscription_id=sub.id))


@bp.post("/subscriptions/<subscription_id>/resume")
@login_required
def resume(subscription_id):
    # Resuming releases every held delivery at once.
    sub = _subscription_or_404(subscription_id, operate=True)
    released = subscription_service.resume(sub)
    flash(f"Resumed: {released} held deliveries are on their way.", "ok")
    return redirect(url_for(".subscription", subscription_id=sub.id))


@bp.post("/subscriptions/<subscription_id>/replay")
@login_required
def replay(subscription_id):
    # Replay all dead letters, or re-send one delivery (dead or succeeded), with a fresh retry schedule.
    sub = _subscription_or_404(subscription_id, operate=True)
    delivery_id = request.form.get("delivery_id")
    n = subscription_service.replay(sub, delivery_ids=[delivery_id] if delivery_id else None)
    flash("Re-sending this delivery." if delivery_id and n else f"Replaying {n} dead deliveries.", "ok")
    target = url_for(".delivery", delivery_id=delivery_id) if delivery_id else \
        url_for(".subscription", subscription_id=sub.id)
    return redirect(target)
