"""Events: the recent ones, or find one by id, type or data.resource_id, and see where it went."""

from __future__ import annotations

import json

from flask import abort, render_template, request
from flask_login import current_user, login_required
from sqlalchemy import select
from sqlalchemy.orm import selectinload

from dashboard.accounts import access
from dashboard.consumers import service as consumer_service
from dashboard.core import paging
from dashboard.core.extensions import db
from dashboard.models import Delivery, Event, Team
from dashboard.web.pages import bp
from dashboard.web.pages.consumers import ConsumerFilter, consumer_filter

RESULTS = 50
FIELDS = {"id": Event.id, "resource_id": Event.resource_id, "type": Event.type}


def _visible(query):
    return access.restrict(query, current_user, Event.team_id)


def _of_consumer(query, chosen: ConsumerFilter):
    """The query narrowed to the chosen team's events, and to those addressed to the chosen consumer."""
    if chosen.team is not None:
        query = query.where(Event.team_id == chosen.team.id)
    if chosen.uid is not None:
        query = query.where(Event.consumer_id.in_(consumer_service.ids_named(chosen.team.id, chosen.uid)))
    return query


@bp.get("/events")
@login_required
def events():
    q = (request.args.get("q") or "").strip()[:200]
    by = request.args.get("by") or "any"
    if by != "any" and by not in FIELDS:
        abort(400, "by must be one of: any, id, resource_id, type")
    chosen = consumer_filter(request.args)
    found: list[Event] = []
    older = None
    shown = select(Event).options(selectinload(Event.team), selectinload(Event.consumer))
    if not q:
        # The newest you may see, a page at a time: keys are time-ordered, so the last one shown starts the next page.
        found, older = paging.by_id(_of_consumer(_visible(shown), chosen), Event.key, RESULTS,
                                    request.args.get("before"))
    else:
        # Each field has its own index; "any" asks each in turn, newest first, and keeps what they find.
        for name in FIELDS if by == "any" else [by]:
            found += db.session.scalars(_of_consumer(_visible(shown), chosen)
                                        .where(FIELDS[name] == q)
                                        .order_by(Event.created_at.desc()).limit(RESULTS - len(found))).all()
            if len(found) >= RESULTS:
                break
    unique = list({(e.team_id, e.id): e for e in found}.values())
    return render_template("events/search.html", q=q, by=by, results=unique, limit=RESULTS, older=older,
                           chosen=chosen)


@bp.get("/events/<event_id>")
@login_required
def event(event_id):
    query = _visible(select(Event).where(Event.id == event_id))
    team = request.args.get("team")
    if team:
        query = query.join(Team, Team.id == Event.team_id).where(Team.name == team)
    matches = db.session.scalars(query.limit(RESULTS)).all()
    if not matches:
        abort(404)
    if len(matches) > 1:  # two teams chose the same id: let the user pick
        return render_template("events/search.html", q=event_id, by="id", results=matches, limit=RESULTS, older=None,
                               chosen=consumer_filter({}))
    ev = matches[0]
    deliveries = db.session.scalars(
        select(Delivery).where(Delivery.event_key == ev.key)
        .options(selectinload(Delivery.subscription), selectinload(Delivery.attempts))
        .order_by(Delivery.created_at, Delivery.id)).all()
    try:
        pretty = json.dumps(json.loads(ev.body), indent=2)
    except ValueError:
        pretty = ev.body
    return render_template("events/page.html", ev=ev, pretty=pretty, deliveries=deliveries)
