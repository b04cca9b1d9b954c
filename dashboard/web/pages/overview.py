"""The overview: every subscription you may see, worst first, with the queue above them."""

from __future__ import annotations

from flask import current_app, render_template, request
from flask_login import current_user, login_required
from sqlalchemy import select
from sqlalchemy.orm import joinedload

from dashboard.accounts import access
from dashboard.core.extensions import db
from dashboard.models import Subscription
from dashboard.stats import overview as figures
from dashboard.subscriptions import checks as check_service
from dashboard.web.pages import bp
from dashboard.web.pages.consumers import ConsumerFilter, consumer_filter, endpoints_query


def visible_subscriptions(chosen: ConsumerFilter):
    query = access.restrict(select(Subscription).where(Subscription.deleted_at.is_(None))  # deleted: by link only
                            .options(joinedload(Subscription.team), joinedload(Subscription.consumer)),
                            current_user, Subscription.team_id)
    return db.session.scalars(endpoints_query(query, chosen).order_by(Subscription.created_at.desc())).all()


@bp.get("/")
@login_required
def overview():
    now = current_app.config["CLOCK"].now()
    chosen = consumer_filter(request.args)
    rows = figures.overview_rows(db.session, visible_subscriptions(chosen), now)
    # Queue depth and workers are every team's together: for those who see every team; others get their own wait.
    queue = figures.queue_figures(current_app, rows) if current_user.role in access.GLOBAL_READERS \
        else figures.QueueFigures(oldest_due_at=figures.oldest_due_of(rows))
    # htmx polls this route for the figures and the table alone; a normal request gets the whole page.
    template = "overview/_subscriptions.html" if request.headers.get("HX-Request") else "overview/page.html"
    return render_template(template, rows=rows, queue=queue, now=now, chosen=chosen,
                           whole_queue=current_user.role in access.GLOBAL_READERS,
                           failed_checks=check_service.latest_failed([h.sub.id for h in rows]))
