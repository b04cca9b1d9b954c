"""The overview: every subscription you may see, worst first, with the queue above them."""

from __future__ import annotations

from flask import current_app, render_template, request
from flask_login import current_user, login_required
from sqlalchemy import select
from sqlalchemy.orm import joinedload

from .. import access, health
from ..extensions import db
from ..models import Subscription
from . import bp


def visible_subscriptions():
    query = access.restrict(select(Subscription).options(joinedload(Subscription.team)), current_user,
                            Subscription.team_id)
    return db.session.scalars(query.order_by(Subscription.created_at.desc())).all()


@bp.get("/")
@login_required
def overview():
    now = current_app.config["CLOCK"].now()
    rows = health.subscriptions_health(db.session, visible_subscriptions(), now)
    queue = health.queue_figures(current_app, rows)
    # htmx polls this route for the figures and the table alone; a normal request gets the whole page.
    template = "overview/_subscriptions.html" if request.headers.get("HX-Request") else "overview/page.html"
    return render_template(template, rows=rows, queue=queue, now=now)
