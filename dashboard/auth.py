"""Dashboard sign-in (Flask-Login). Who may do what once signed in: `dashboard.access`."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required, login_user, logout_user
from sqlalchemy import select

from .extensions import db, login_manager
from .models import User

bp = Blueprint("auth", __name__)


@login_manager.user_loader
def load_user(user_id: str):
    user = db.session.get(User, int(user_id)) if user_id.isdigit() else None
    # A deactivated user's open session stops working at its next request.
    return user if user is not None and user.is_active else None


def _safe_next(target: str | None) -> str:
    # Only local paths: never bounce a fresh login to another site.
    if target and target.startswith("/") and not target.startswith("//"):
        return target
    return url_for("pages.overview")


@bp.route("/login", methods=["GET", "POST"])
def login():
    if current_user.is_authenticated:
        return redirect(url_for("pages.overview"))
    if request.method == "POST":
        email = request.form.get("email", "").strip().lower()
        user = db.session.scalar(select(User).where(User.email == email))
        if user is not None and user.check_password(request.form.get("password", "")):
            if login_user(user):  # False for a deactivated user
                return redirect(_safe_next(request.args.get("next")))
            flash("This account is deactivated; an admin can reactivate it.", "error")
            return render_template("auth/login.html", email=email), 403
        flash("Wrong email or password.", "error")
        return render_template("auth/login.html", email=email), 401
    return render_template("auth/login.html", email="")


@bp.post("/logout")
@login_required
def logout():
    # POST only: a link or an image tag must not be able to sign someone out.
    logout_user()
    return redirect(url_for("auth.login"))
