"""Dashboard sign-in (Flask-Login) and the role checks every view goes through."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required, login_user, logout_user
from sqlalchemy import select

from .extensions import db, login_manager
from .models import Subscription, User

bp = Blueprint("auth", __name__)

# Operators and admins see and repair every team's subscriptions; owners and members their own team's.
GLOBAL_ROLES = {"admin", "operator"}


@login_manager.user_loader
def load_user(user_id: str):
    return db.session.get(User, int(user_id)) if user_id.isdigit() else None


def can_view(user, sub: Subscription) -> bool:
    return user.role in GLOBAL_ROLES or (user.team_id is not None and user.team_id == sub.team_id)


def can_operate(user, sub: Subscription) -> bool:
    """Pause, resume, replay: operators anywhere, owners on their own team."""
    return user.role in GLOBAL_ROLES or (user.role == "owner" and user.team_id == sub.team_id)


def _safe_next(target: str | None) -> str:
    # Only local paths: never bounce a fresh login to another site.
    if target and target.startswith("/") and not target.startswith("//"):
        return target
    return url_for("views.index")


@bp.route("/login", methods=["GET", "POST"])
def login():
    if current_user.is_authenticated:
        return redirect(url_for("views.index"))
    if request.method == "POST":
        email = request.form.get("email", "").strip().lower()
        user = db.session.scalar(select(User).where(User.email == email))
        if user is not None and user.check_password(request.form.get("password", "")):
            login_user(user)
            return redirect(_safe_next(request.args.get("next")))
        flash("Wrong email or password.", "error")
        return render_template("auth/login.html", email=email), 401
    return render_template("auth/login.html", email="")


@bp.post("/logout")
@login_required
def logout():
    # POST only: a link or an image tag must not be able to sign someone out.
    logout_user()
    return redirect(url_for("auth.login"))
