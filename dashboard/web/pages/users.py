"""Users (admins only): create one with a one-time password, change a role, deactivate or reactivate.

Every change answers with a redirect (post/redirect/get): reloading the page never repeats it."""

from __future__ import annotations

from flask import abort, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required
from sqlalchemy import select
from sqlalchemy.orm import selectinload

from dashboard.accounts import access
from dashboard.accounts import service as accounts
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.models import Team, User
from dashboard.web.pages import bp, shown_once


# The role a new user gets unless the admin picks another: the least privilege.
DEFAULT_ROLE = "member"


def _page(status: int = 200, **shown):
    users = db.session.scalars(select(User).options(selectinload(User.team)).order_by(User.email)).all()
    teams = db.session.scalars(select(Team).order_by(Team.name)).all()
    return render_template("users/page.html", users=users, teams=teams, roles=User.ROLES,
                           roles_table=access.ROLES_TABLE, default_role=DEFAULT_ROLE, **shown), status


def _admin_only():
    access.require_admin("manage users")


def _user_or_404(user_id: int) -> User:
    user = db.session.get(User, user_id)
    if user is None:
        abort(404)
    return user


@bp.get("/users")
@login_required
def users():
    _admin_only()
    kept = shown_once.take("user")
    created = db.session.get(User, int(kept[0])) if kept else None
    if created is None:
        return _page()
    body, status = _page(created=created, password=kept[1])
    return body, status, {"Cache-Control": "no-store"}


@bp.post("/users")
@login_required
def create_user():
    # The password is shown on the next page and never again (only its hash is kept).
    _admin_only()
    form = request.form
    try:
        user, password = accounts.create_user(form.get("email", ""), form.get("role", ""), form.get("team"))
    except ApiError as exc:
        db.session.rollback()
        flash(exc.message, "error")
        return _page(exc.status, form=form)
    return shown_once.show_after_redirect("user", user.id, password, url_for(".users"),
                                          lambda: _page(created=user, password=password))


@bp.post("/users/<int:user_id>/role")
@login_required
def change_role(user_id):
    _admin_only()
    user = _user_or_404(user_id)
    try:
        accounts.change_role(user, request.form.get("role", ""), request.form.get("team"), acting=current_user)
    except ApiError as exc:
        db.session.rollback()
        flash(exc.message, "error")
        return _page(exc.status)
    flash(f"{user.email} is now {user.role}" + (f" of {user.team.name}." if user.team else " (all teams)."), "ok")
    return redirect(url_for(".users"))


def _set_active(user_id: int, active: bool):
    _admin_only()
    user = _user_or_404(user_id)
    try:
        accounts.set_active(user, active, acting=current_user)
    except ApiError as exc:
        flash(exc.message, "error")
        return _page(exc.status)
    flash(f"{user.email} is {'reactivated' if active else 'deactivated: their sessions have ended'}.", "ok")
    return redirect(url_for(".users"))


@bp.post("/users/<int:user_id>/deactivate")
@login_required
def deactivate_user(user_id):
    # Deactivated, not deleted: the audit log still names them, and an admin can reactivate them.
    return _set_active(user_id, False)


@bp.post("/users/<int:user_id>/reactivate")
@login_required
def reactivate_user(user_id):
    return _set_active(user_id, True)
