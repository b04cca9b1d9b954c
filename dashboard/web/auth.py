"""Dashboard sign-in (Flask-Login). Who may do what once signed in: `dashboard.accounts.access`."""

from __future__ import annotations

import datetime as dt
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
from flask_login import current_user, login_required, login_url, login_user, logout_user
from flask_wtf.csrf import generate_csrf
from limits import parse
from sqlalchemy import select
from werkzeug.security import check_password_hash, generate_password_hash

from dashboard import audit
from dashboard.accounts import access
from dashboard.accounts import service as accounts
from dashboard.accounts.login_throttle import LoginThrottle
from dashboard.accounts.passwords import min_length
from dashboard.consumers import portal
from dashboard.core.clock import unix
from dashboard.core.extensions import db, login_manager
from dashboard.core.validation import ApiError
from dashboard.models import AuditEntry, User
from dashboard.web.paths import in_portal

bp = Blueprint("auth", __name__)


@login_manager.user_loader
def load_user(session_id: str):
    if in_portal():
        # The portal's cookie holds "portal:<session token>" (access.PortalUser.get_id), and nothing else does.
        kind, _, token = session_id.partition(":")
        if kind != access.PORTAL or not token:
            return None
        found = portal.session_of(token)
        if found is None:
            g.portal_team_id = portal.team_of_session(token)  # its "ended" page may still be framed by the team
            return None
        return access.PortalUser(token, found.team_id, found.consumer_id, found.uid)
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


# -- sign-ins in the audit log: who (the user, or the name tried; never a password), from where -------------

def _audit_sign_in(action: str, name: str, user: User | None, **detail) -> None:
    """An audit entry for a sign-in, committed at once: a refused sign-in changes nothing else to commit with.
    It belongs to no team: admins see it, and the person it names (dashboard.web.pages.audit)."""
    actor = ("user", user.email) if action == "user.signed_in" else ("anonymous", name)
    audit.record(action, actor=actor, detail={"address": request.remote_addr or "unknown", **detail})
    db.session.commit()


def _audit_lockout(name: str, refusal) -> None:
    """One entry per account or address and throttle window, however many refused tries follow it."""
    address = request.remote_addr or "unknown"
    by_account = refusal.reason == "this account"
    limit = current_app.config["PROMESA_LOGIN_LIMIT_PER_ACCOUNT" if by_account else "PROMESA_LOGIN_LIMIT_PER_ADDRESS"]
    now = current_app.config["CLOCK"].now()
    target = None if by_account else f"address:{address}"[:120]
    recent = select(AuditEntry.id).where(AuditEntry.action == "user.locked_out",
                                         AuditEntry.at > now - dt.timedelta(seconds=parse(limit).get_expiry()))
    recent = recent.where(AuditEntry.actor == name, AuditEntry.target.is_(None)) if by_account \
        else recent.where(AuditEntry.target == target)
    if db.session.scalar(recent.limit(1)) is not None:
        return
    until = now + dt.timedelta(seconds=refusal.retry_after_seconds)
    audit.record("user.locked_out", actor=("anonymous", name), target=target,
                 detail={"address": address, "locked": refusal.reason, "until": until.isoformat(timespec="seconds")})
    db.session.commit()


# -- how long a session lasts --------------------------------------------------------------------------------
SIGNED_IN_AT, SEEN_AT = "signed_in_at", "seen_at"  # unix seconds, in the signed session cookie
SEEN_EVERY = 60  # seconds: the cookie is written again at most once a minute to record activity


def _now() -> float:
    return unix(current_app.config["CLOCK"].now())


def _start_session_clock() -> None:
    session[SIGNED_IN_AT] = session[SEEN_AT] = _now()


def _session_over(now: float) -> str | None:
    """Why this session has ended (idle too long, or too old), or None while it lasts."""
    signed_in_at, seen_at = session.get(SIGNED_IN_AT), session.get(SEEN_AT)
    if not isinstance(signed_in_at, (int, float)) or not isinstance(seen_at, (int, float)):
        return "Your session has ended; sign in again."  # a cookie from before sessions had a clock
    max_days = float(current_app.config["PROMESA_SESSION_MAX_DAYS"])
    if now - signed_in_at > max_days * 86400:
        return f"Your session ended {max_days:g} days after you signed in; sign in again."
    idle_hours = float(current_app.config["PROMESA_SESSION_IDLE_HOURS"])
    if now - seen_at > idle_hours * 3600:
        return f"Your session ended after {idle_hours:g} hours without activity; sign in again."
    return None


def _is_activity() -> bool:
    # A page's own htmx GETs (polling, refreshed fragments) are not someone at the keyboard.
    return request.endpoint != "static" and not (request.method == "GET" and request.headers.get("HX-Request"))


def _end_or_extend_session():
    if "_user_id" not in session or in_portal():  # a portal session lasts as long as its link (load_user)
        return None
    now = _now()
    ended = _session_over(now)
    if ended:
        logout_user()
        _fresh_session()
        flash(ended, "info")
        g.session_ended = True
        return None  # login_required sends the request on to the sign-in page
    if _is_activity() and now - session[SEEN_AT] >= SEEN_EVERY:
        session[SEEN_AT] = now
    return None


@login_manager.unauthorized_handler
def _sign_in_first():
    if in_portal():
        # No sign-in form here: a consumer gets in only through a new link from the producer.
        return render_template("portal/ended.html", reason=None), 401
    if request.headers.get("HX-Request"):
        # A fragment's own request: take the whole page to the sign-in form, never swap the form into the fragment.
        return "", 401, {"HX-Redirect": url_for("auth.login")}
    if not g.get("session_ended"):  # that flash already says why
        flash(login_manager.login_message, login_manager.login_message_category)
    return redirect(login_url(login_manager.login_view, next_url=request.url))


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
            _audit_lockout(email, refusal)
            page = render_template("auth/login.html", email=email)
            return page, 429, {"Retry-After": str(refusal.retry_after_seconds)}
        user = db.session.scalar(select(User).where(User.email == email))
        if _password_matches(user, password):
            throttle.succeeded(attempt)
            if not user.is_active:
                _audit_sign_in("user.sign_in_failed", email, user, reason="deactivated")
                flash("This account is deactivated; an admin can reactivate it.", "error")
                return render_template("auth/login.html", email=email), 403
            _fresh_session()  # nothing from before the sign-in (a CSRF token, a planted session) survives it
            login_user(user)
            _start_session_clock()
            _audit_sign_in("user.signed_in", email, user)
            return redirect(_safe_next(request.args.get("next")))
        _audit_sign_in("user.sign_in_failed", email, user,
                       reason="wrong password" if user is not None else "no such user")
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


@bp.route("/account/password", methods=["GET", "POST"])
@login_required
def change_password():
    # Post/redirect/get: a reload never sends the passwords again.
    if request.method == "POST":
        form = request.form
        user = db.session.get(User, current_user.id)
        try:
            accounts.change_password(user, form.get("current", ""), form.get("new", ""), form.get("repeat", ""),
                                     address=request.remote_addr)
        except ApiError as exc:
            db.session.rollback()
            flash(exc.message[:1].upper() + exc.message[1:] + ".", "error")
            return render_template("auth/password.html", min_length=min_length()), exc.status
        signed_in_at = session.get(SIGNED_IN_AT)
        _fresh_session()  # the change ended every session of this user; this one goes on under the new version
        login_user(user)
        _start_session_clock()
        session[SIGNED_IN_AT] = signed_in_at if isinstance(signed_in_at, (int, float)) else session[SIGNED_IN_AT]
        flash("Your password is changed; your other sessions have ended.", "ok")
        return redirect(url_for("auth.change_password"))
    return render_template("auth/password.html", min_length=min_length())


def init_app(app) -> None:
    login_manager.init_app(app)
    login_manager.login_view = "auth.login"
    login_manager.login_message = "Sign in to see this page."  # the words of the form's button and heading
    app.before_request(_end_or_extend_session)
    app.register_blueprint(bp)
