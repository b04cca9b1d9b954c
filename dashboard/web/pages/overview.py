"""The overview: the subscriptions you may see that a person should look at, worst first, with the queue above
them: every team's own endpoint, and of its consumers' endpoints those that need a person now (the others counted)."""

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


def team_clauses(chosen: ConsumerFilter) -> list:
    """Clauses on Subscription.team_id: the teams the user may see, narrowed to the chosen one."""
    teams = [c for c in (access.visible_to(current_user, Subscription.team_id),) if c is not None]
    if chosen.team is not None:
        teams.append(Subscription.team_id == chosen.team.id)
    return teams


def visible_subscriptions(chosen: ConsumerFilter) -> tuple[list[Subscription], int]:
    """The endpoints the overview lists, and how many consumer endpoints it leaves out. With a consumer chosen,
    its endpoints. Otherwise the teams' own endpoints, and of their consumers' (there may be 100,000) only those
    that need a person now (figures.consumer_endpoints_needing_a_person); the rest are counted, not listed."""
    query = access.restrict(select(Subscription).where(Subscription.deleted_at.is_(None))  # deleted: by link only
                            .options(joinedload(Subscription.team), joinedload(Subscription.consumer)),
                            current_user, Subscription.team_id)
    query = endpoints_query(query, chosen).order_by(Subscription.created_at.desc())
    if chosen.uid is not None:
        return db.session.scalars(query).all(), 0
    teams = team_clauses(chosen)
    own = db.session.scalars(query.where(Subscription.consumer_id.is_(None))).all()
    needing = db.session.scalars(query.where(
        Subscription.id.in_(figures.consumer_endpoints_needing_a_person(teams)))).all()
    return own + needing, figures.consumer_endpoint_count(db.session, teams) - len(needing)


@bp.get("/")
@login_required
def overview():
    now = current_app.config["CLOCK"].now()
    chosen = consumer_filter(request.args)
    subscriptions, unlisted = visible_subscriptions(chosen)
    rows = figures.overview_rows(db.session, subscriptions, now)
    # Queue depth and workers are every team's together: for those who see every team; others get their own wait.
    queue = figures.queue_figures(current_app, rows) if current_user.role in access.GLOBAL_READERS \
        else figures.QueueFigures(oldest_due_at=figures.oldest_due_of(rows))
    if unlisted:  # the endpoints left out wait too: their oldest due delivery counts
        queue.oldest_due_at = figures.oldest_due(db.session, team_clauses(chosen), now)
    # htmx polls this route for the figures and the table alone; a normal request gets the whole page.
    template = "overview/_subscriptions.html" if request.headers.get("HX-Request") else "overview/page.html"
    return render_template(template, rows=rows, queue=queue, now=now, chosen=chosen, unlisted=unlisted,
                           whole_queue=current_user.role in access.GLOBAL_READERS,
                           failed_checks=check_service.latest_failed([h.sub.id for h in rows]))
