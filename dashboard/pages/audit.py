"""The audit log: who changed what, when, on which subscription, filtered; newest first, page by page."""

from __future__ import annotations

import datetime as dt

from flask import abort, render_template, request, url_for
from flask_login import current_user, login_required
from sqlalchemy import and_, or_, select

from .. import access
from ..extensions import db
from ..models import AuditEntry, Team
from . import bp

PAGE = 50


def _time(name: str) -> dt.datetime | None:
    value = (request.args.get(name) or "").strip()
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value).replace(tzinfo=None)
    except ValueError:
        abort(400, f"{name} must be a time like 2026-11-30T14:00 (UTC)")


def _cursor(value: str | None) -> tuple[dt.datetime, int] | None:
    """`before` is the last entry of the previous page, as "<at>~<id>": entries are ordered by (at, id)."""
    if not value:
        return None
    at, _, entry_id = value.rpartition("~")
    try:
        return dt.datetime.fromisoformat(at), int(entry_id)
    except ValueError:
        abort(400, "before must be the link from the previous page")


def visible_teams() -> list[Team]:
    return db.session.scalars(access.restrict(select(Team), current_user, Team.id).order_by(Team.name)).all()


@bp.get("/audit")
@login_required
def audit():
    teams = visible_teams()
    filters = {name: (request.args.get(name) or "").strip() for name in ("actor", "action", "subscription", "team")}
    query = access.restrict(select(AuditEntry), current_user, AuditEntry.team_id)
    if filters["actor"]:
        query = query.where(AuditEntry.actor == filters["actor"].lower() if "@" in filters["actor"]
                            else AuditEntry.actor == filters["actor"])
    if filters["action"]:
        query = query.where(AuditEntry.action == filters["action"])
    if filters["subscription"]:
        query = query.where(AuditEntry.subscription_id == filters["subscription"])
    if filters["team"]:
        team = next((t for t in teams if t.name == filters["team"]), None)
        if team is None:
            abort(404)  # not a team this user may see
        query = query.where(AuditEntry.team_id == team.id)
    since, until = _time("since"), _time("until")
    if since:
        query = query.where(AuditEntry.at >= since)
    if until:
        query = query.where(AuditEntry.at < until)
    before = _cursor(request.args.get("before"))
    if before:
        query = query.where(or_(AuditEntry.at < before[0], and_(AuditEntry.at == before[0], AuditEntry.id < before[1])))
    rows = db.session.scalars(query.order_by(AuditEntry.at.desc(), AuditEntry.id.desc()).limit(PAGE + 1)).all()
    entries = rows[:PAGE]
    older_url = None
    if len(rows) > PAGE:
        kept = {k: v for k, v in request.args.items() if k != "before" and v}
        older_url = url_for(".audit", **kept, before=f"{entries[-1].at.isoformat()}~{entries[-1].id}")
    return render_template("audit/page.html", audit_entries=entries, filters=filters, teams=teams,
                           since=request.args.get("since", ""), until=request.args.get("until", ""),
                           older_url=older_url)
