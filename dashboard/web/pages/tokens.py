"""Producer API tokens: owners manage their team's, admins every team's. A new token is shown once."""

from __future__ import annotations

import datetime as dt

from flask import abort, current_app, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required
from sqlalchemy import select
from sqlalchemy.orm import selectinload

from dashboard.accounts import access
from dashboard.accounts import service as accounts
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.models import ApiToken, Team
from dashboard.web.pages import bp, shown_once

# How long a new token lasts, in days (0: until revoked).
EXPIRY_CHOICES = [(0, "never (until revoked)"), (1, "1 day"), (7, "7 days"), (30, "30 days"), (90, "90 days"),
                  (365, "1 year")]


def _may_manage_some_team() -> None:
    access.require(access.is_admin(current_user) or current_user.role == "owner")


def _page(status: int = 200, **shown):
    query = select(ApiToken).options(selectinload(ApiToken.team), selectinload(ApiToken.use))
    if not access.is_admin(current_user):  # an owner: their own team's tokens
        query = query.where(ApiToken.team_id == current_user.team_id)
    tokens = db.session.scalars(query.order_by(ApiToken.revoked_at.is_not(None), ApiToken.created_at.desc())).all()
    teams = db.session.scalars(select(Team).order_by(Team.name)).all() if access.is_admin(current_user) else []
    return render_template("tokens/page.html", tokens=tokens, teams=teams, expiry_choices=EXPIRY_CHOICES,
                           now=current_app.config["CLOCK"].now(), **shown), status


def _expiry_from_form() -> dt.datetime | None:
    raw = request.form.get("expires_in_days", "0").strip() or "0"
    if raw not in {str(days) for days, _ in EXPIRY_CHOICES}:
        raise ApiError(400, "choose how long the token lasts from the list")
    days = int(raw)
    return current_app.config["CLOCK"].now() + dt.timedelta(days=days) if days else None


@bp.get("/tokens")
@login_required
def tokens():
    _may_manage_some_team()
    kept = shown_once.take("token")
    created = db.session.get(ApiToken, int(kept[0])) if kept else None
    if created is None:
        return _page()
    body, status = _page(created=created, plaintext=kept[1])
    return body, status, {"Cache-Control": "no-store"}


@bp.post("/tokens")
@login_required
def create_token():
    # The token is shown once, on the page this redirects to, and never again (only its SHA-256 is kept).
    _may_manage_some_team()
    if access.is_admin(current_user):
        team = db.session.scalar(select(Team).where(Team.name == request.form.get("team", "")))
        if team is None:
            flash("Choose the team the token is for.", "error")
            return _page(400)
    else:
        team = current_user.team
    access.require(team is not None and access.can_manage_tokens(current_user, team.id))
    try:
        token, plaintext = accounts.create_token(team, name=request.form.get("name", ""),
                                                 expires_at=_expiry_from_form())
    except ApiError as exc:
        db.session.rollback()
        flash(exc.message, "error")
        return _page(exc.status)
    return shown_once.show_after_redirect("token", str(token.id), plaintext, url_for(".tokens"),
                                          lambda: _page(created=token, plaintext=plaintext))


@bp.post("/tokens/<int:token_id>/revoke")
@login_required
def revoke_token(token_id):
    # Revoking takes effect on the token's next request; producers using it get 401 from then on.
    token = db.session.get(ApiToken, token_id)
    if token is None or not access.can_view_team(current_user, token.team_id):
        abort(404)
    access.require(access.can_manage_tokens(current_user, token.team_id))
    name = token.name or token.display_prefix + "…"
    if accounts.revoke_token(token):
        flash(f"Revoked {name}: it is refused from now on.", "ok")
    else:
        flash(f"{name} was already revoked: nothing changed.", "ok")
    return redirect(url_for(".tokens"))
