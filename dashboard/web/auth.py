"""Dashboard sign-in (Flask-Login). Who may do what once signed in: `dashboard.accounts.access`."""

from __future__ import annotations

import math
import secrets
from functools import lru_cache
from urllib.parse import urlsplit

from flask import (
    Blueprint,
    current_app,
    flash,
    g,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask_login import current_user, login_required, login_user, logout_user
from flask_wtf.csrf import generate_csrf
from sqlalchemy import select
from werkzeug.security import check_password_hash, generate_password_hash

from dashboard.accounts.login_throttle import LoginThrottle
from dashboard.core.extensions import db, login_manager
from dashboard.models import User

bp = Blueprint("auth", __name__)


@login_manager.user_loader
def load_user(session_id: str):
    # "<user id>:<session version>" (User.get_id): a cookie from before a sign-out names an old version.
    user_id, _, version = session_id.partition(":")
    if not (user_id.isdigit() and version.isdigit()):
        return None
    user = db.session.get(User, int(user_id))
    # A deactivated user's open session stops working at its next request, as does an old version's.
    return user if user is not None and user.is_active and user.session_version == int(version) else None


def _safe_next(target: str | None) -> str:
    # Only a plain local path: never bounce a fresh login to another site.
    return target if is_local_path(target) else url_for("pages.overview")


def is_local_path(target: str | None) -> bool:
    """True for "/path?query" on this site. Browsers drop tabs and newlines and read a backslash as "/",
    so "/<tab>/evil.example/" means "//evil.example/": refuse control characters and backslashes outright."""
    if not target or not target.startswith("/") or target.startswith("//"):
        return False
    if "\\" in target or _has_control_character(target):
        return False
    parts = urlsplit(target)
    return not parts.scheme and not parts.netloc


EMAIL_MAX_LENGTH = 254  # the users.email column


def _has_control_character(text: str) -> bool:
    return any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text)


def _email_problem(email: str) -> str | None:
    if len(email) > EMAIL_MAX_LENGTH:
        return f"The email address is longer than {EMAIL_MAX_LENGTH} characters."
    if _has_control_character(email):
        return "The email address contains a control character."
    return None


@lru_cache(maxsize=1)
def _dummy_password_hash() -> str:
    # Hashed with the same method as real passwords, so an unknown email costs what a known one does.
    return generate_password_hash(secrets.token_urlsafe(16))


def _password_matches(user: User | None, password: str) -> bool:
    if user is None:
        check_password_hash(_dummy_password_hash(), password)
        return False
    return user.check_password(password)


def _fresh_session() -> None:
    """An empty session with a new CSRF token, stored in this response (streamed pages cannot set cookies)."""
    session.clear()
    g.pop(current_app.config.get("WTF_CSRF_FIELD_NAME", "csrf_token"), None)  # Flask-WTF caches the old one in g
    generate_csrf()


@bp.route("/login", methods=["GET", "POST"])
def login():
    if current_user.is_authenticated:
        return redirect(url_for("pages.overview"))
    if request.method == "POST":
        email = request.form.get("email", "").strip().lower()
        password = request.form.get("password", "")
        problem = _email_problem(email)
        if problem:
            flash(problem, "error")
            return render_template("auth/login.html", email=""), 400
        throttle = LoginThrottle.for_app()
        attempt = throttle.attempt(email, request.remote_addr)  # counted as failed until the password matches
        refusal = attempt.refusal
        if refusal:
            minutes = math.ceil(refusal.retry_after_seconds / 60)
            flash(f"Too many failed sign-ins for {refusal.reason}. Try again in {minutes} minute"
                  f"{'s' if minutes != 1 else ''}.", "error")
            page = render_template("auth/login.html", email=email)
            return page, 429, {"Retry-After": str(refusal.retry_after_seconds)}
        user = db.session.scalar(select(User).where(User.email == email))
        if _password_matches(user, password):
            throttle.succeeded(attempt)
            if not user.is_active:
                flash("This account is deactivated; an admin can reactivate it.", "error")
                return render_template("auth/login.html", email=email), 403
            _fresh_session()  # nothing from before the sign-in (a CSRF token, a planted session) survives it
            login_user(user)
            return redirect(_safe_next(request.args.get("next")))
        flash("Wrong email or password.", "error")
        return render_template("auth/login.html", email=email), 401
    return render_template("auth/login.html", email="")


@bp.post("/logout")
@login_required
def logout():
    # POST only: a link or an image tag must not be able to sign someone out.
    current_user.end_sessions()  # on the server: a copy of this cookie must not outlive the sign-out
    db.session.commit()
    logout_user()
    _fresh_session()
    return redirect(url_for("auth.login"))


def init_app(app) -> None:
    login_manager.init_app(app)
    login_manager.login_view = "auth.login"
    app.register_blueprint(bp)
