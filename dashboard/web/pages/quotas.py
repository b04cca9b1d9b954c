"""Quotas: every team sees its own; readers of every team see each team's; admins set a team's own values."""

from __future__ import annotations

from flask import abort, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required
from sqlalchemy import select

from dashboard.accounts import access
from dashboard.core.extensions import db
from dashboard.ingest import quotas
from dashboard.models import Team
from dashboard.web.pages import bp


@bp.get("/quotas")
@login_required
def quotas_page():
    query = access.restrict(select(Team).order_by(Team.name), current_user, Team.id)
    owed = quotas.owed_by_team()  # one count for every team shown
    teams = [(team, quotas.describe(team, owed)) for team in db.session.scalars(query)]
    return render_template("quotas/page.html", teams=teams, editable=access.is_admin(current_user),
                           names=quotas.QUOTAS)


@bp.post("/quotas/<int:team_id>")
@login_required
def set_quotas(team_id):
    access.require(access.is_admin(current_user))
    team = db.session.get(Team, team_id)
    if team is None:
        abort(404)
    wanted = {}
    for name, quota in quotas.QUOTAS.items():  # every field is checked before anything is saved
        raw = request.form.get(name, "").strip().replace("_", "").replace(",", "")
        if not raw:
            wanted[name] = None
            continue
        if not raw.isdigit() or not quota.lowest <= int(raw) <= quota.highest:
            flash(f"{name} must be a whole number from {quota.lowest} to {quota.highest}, or empty for the default "
                  f"({quota.default}).", "error")
            return redirect(url_for(".quotas_page")), 303
        wanted[name] = int(raw)
    own = quotas.overrides(team.id)
    changed = [name for name, value in wanted.items() if own.get(name) != value]
    for name in changed:
        quotas.set_override(team, name, wanted[name])
    said = [f"{name.replace('_', ' ')} {_quota_in_words(name, wanted[name])} "
            f"(was {_quota_in_words(name, own.get(name))})" for name in changed]
    flash(f"Quotas of {team.name}: " + ("; ".join(said) + "." if changed else "nothing changed."), "ok")
    return redirect(url_for(".quotas_page"))


def _quota_in_words(name: str, value: int | None) -> str:
    return f"the default, {quotas.QUOTAS[name].default:,}" if value is None else f"{value:,}"
