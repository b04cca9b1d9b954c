"""The overview: every subscription you may see, with what is waiting for it."""

from __future__ import annotations

from flask import render_template, request
from flask_login import current_user, login_required
from sqlalchemy import func, select

from .. import access
from ..extensions import db
from ..models import Delivery, DeliveryState, Subscription
from . import bp

OPEN_STATES = (DeliveryState.PENDING, DeliveryState.SCHEDULED, DeliveryState.HELD, DeliveryState.DEAD)


def visible_subscriptions():
    query = access.restrict(select(Subscription).where(Subscription.deleted_at.is_(None)),  # deleted: by link only
                            current_user, Subscription.team_id)
    return db.session.scalars(query.order_by(Subscription.created_at.desc())).all()


@bp.get("/")
@login_required
def overview():
    subs = visible_subscriptions()
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
    template = "overview/_subscriptions.html" if request.headers.get("HX-Request") else "overview/page.html"
    return render_template(template, subscriptions=subs, counts=counts)
