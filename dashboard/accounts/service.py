"""Users and API tokens: created, changed and revoked here, by the dashboard and the CLI alike, and audited.

Secrets (a new user's password, a new token) are returned to the caller once and never stored in
clear: only a password hash and a token's SHA-256 are kept.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import secrets
import threading

from flask import current_app
from sqlalchemy import func, select, text
from sqlalchemy.exc import SQLAlchemyError

from dashboard import audit
from dashboard.accounts.access import GLOBAL_READERS, ROLES
from dashboard.accounts.passwords import password_problem
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.models import ApiToken, AuditEntry, Team, User

log = logging.getLogger(__name__)

EMAIL_RE = re.compile(r"^[^@\s]{1,64}@[^@\s]+\.[^@\s]+$")
TEAM_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.\-]{0,99}$")


def team_named(name: str) -> Team:
    """The team of this name, created when it does not exist yet."""
    name = name.strip()
    if not TEAM_NAME_RE.match(name):
        raise ApiError(400, "a team name is 1 to 100 letters, digits, spaces, '_', '.' or '-'")
    team = db.session.scalar(select(Team).where(Team.name == name))
    if team is None:
        team = Team(name=name)
        db.session.add(team)
        db.session.flush()
    return team


def _check_role(role: str, team: Team | None) -> None:
    if role not in ROLES:
        raise ApiError(400, f"role must be one of: {', '.join(ROLES)}")
    if role not in GLOBAL_READERS and role != "admin" and team is None:
        raise ApiError(400, f"a {role} belongs to a team: name one")


def create_user(email: str, role: str, team_name: str | None = None,
                password: str | None = None, actor=None) -> tuple[User, str]:
    """A new user, and the password to hand them (generated when not given). Nothing is stored on a bad field."""
    email = (email or "").strip().lower()
    if not EMAIL_RE.match(email) or len(email) > 254:
        raise ApiError(400, "email must be an address like someone@example.com")
    if db.session.scalar(select(User.id).where(User.email == email)):
        raise ApiError(409, f"a user with email {email} already exists")
    team = team_named(team_name) if team_name and team_name.strip() else None
    _check_role(role, team)
    if password is not None:
        _check_password(password, email)
    password = password or secrets.token_urlsafe(12)
    user = User(email=email, role=role, team=team if role not in GLOBAL_READERS else None, active=True)
    user.set_password(password)
    db.session.add(user)
    db.session.flush()
    audit.record("user.created", team_id=user.team_id, target=f"user:{email}", detail={"role": role}, actor=actor)
    db.session.commit()
    return user, password


def _check_password(password: str, email: str) -> None:
    problem = password_problem(password, email)
    if problem:
        raise ApiError(400, problem)


# Wrong current passwords allowed per user and window on the change page, counted from the audit log, so a
# stolen session cannot guess its way to the password faster than the sign-in throttle allows.
CHANGE_TRIES, CHANGE_WINDOW = 5, dt.timedelta(minutes=15)


def change_password(user: User, current: str, new: str, confirmation: str, address: str | None = None) -> None:
    """The user's own change: the current password proves it is them; every other session of theirs ends
    (the caller signs this one in again). Nothing changes on a wrong or weak field."""
    now = current_app.config["CLOCK"].now()
    wrong = db.session.scalar(select(func.count()).select_from(AuditEntry).where(
        AuditEntry.action == "user.password_change_refused", AuditEntry.actor == user.email,
        AuditEntry.at > now - CHANGE_WINDOW))
    if wrong >= CHANGE_TRIES:
        raise ApiError(429, f"the current password was wrong {CHANGE_TRIES} times; try again in "
                            f"{CHANGE_WINDOW.seconds // 60} minutes")
    if not user.check_password(current):
        audit.record("user.password_change_refused", actor=("user", user.email),
                     detail={"address": address or "unknown", "reason": "wrong current password"})
        db.session.commit()
        raise ApiError(400, "the current password is wrong")
    if new != confirmation:
        raise ApiError(400, "the new password and its repetition differ")
    if new == current:
        raise ApiError(400, "the new password is the current one")
    _check_password(new, user.email)
    user.set_password(new)
    user.end_sessions()
    audit.record("user.password_changed", actor=("user", user.email))  # no target: the actor is the user
    db.session.commit()


def _not_yourself(user: User, acting: User | None, what: str) -> None:
    # An admin who demotes or deactivates themselves could leave nobody able to undo it.
    if acting is not None and acting.id == user.id:
        raise ApiError(400, f"you cannot {what} yourself; ask another admin")


def change_role(user: User, role: str, team_name: str | None, acting: User | None = None) -> None:
    _not_yourself(user, acting, "change the role of")
    team = team_named(team_name) if team_name and team_name.strip() else user.team
    _check_role(role, team)
    before = {"role": user.role, "team": user.team.name if user.team else None}
    user.role = role
    user.team = None if role in GLOBAL_READERS else team
    after = {"role": role, "team": user.team.name if user.team else None}
    audit.record("user.role_changed", team_id=user.team_id or (team.id if team else None), target=f"user:{user.email}",
                 detail={"from": f"{before['role']} ({before['team'] or 'all teams'})",
                         "to": f"{after['role']} ({after['team'] or 'all teams'})"})
    db.session.commit()


def set_active(user: User, active: bool, acting: User | None = None) -> None:
    """Deactivated users cannot sign in, and their open sessions stop at their next request."""
    _not_yourself(user, acting, "deactivate" if not active else "reactivate")
    if user.active == active:
        return
    user.active = active
    if not active:
        user.end_sessions()
    audit.record("user.reactivated" if active else "user.deactivated", team_id=user.team_id,
                 target=f"user:{user.email}")
    db.session.commit()


TOKEN_NAME_MAX = 100


def create_token(team: Team, actor=None, *, name: str = "", expires_at: dt.datetime | None = None
                 ) -> tuple[ApiToken, str]:
    """A new producer token for the team, and its plaintext: shown once, only its hash is kept.
    `name`: what it is for; `expires_at`: when it stops working (None: never)."""
    name = (name or "").strip()
    if len(name) > TOKEN_NAME_MAX or any(ord(ch) < 0x20 for ch in name):
        raise ApiError(400, f"a token's name is at most {TOKEN_NAME_MAX} characters, on one line")
    now = current_app.config["CLOCK"].now()
    if expires_at is not None and expires_at <= now:
        raise ApiError(400, "the expiry must be in the future")
    actor = actor or audit.current_actor()
    token, plaintext = ApiToken.issue(team)
    token.created_at, token.name, token.expires_at, token.created_by = now, name, expires_at, actor[1]
    db.session.add(token)
    db.session.flush()
    audit.record("token.created", team_id=team.id, target=f"token:{token.display_prefix}", actor=actor,
                 detail={"name": name, **({"expires_at": expires_at.isoformat()} if expires_at else {})})
    db.session.commit()
    return token, plaintext


# A token's last use is written at most once a minute: this process remembers when it last wrote it,
# and the UPDATE itself skips a row written less than a minute ago (by another process).
LAST_USE_EVERY = dt.timedelta(minutes=1)
_last_written: dict[str, dt.datetime] = {}
_last_written_lock = threading.Lock()
_NOTE_USE = text(
    "INSERT INTO api_token_uses (token_id, last_used_at) "
    "SELECT id, :now FROM api_tokens WHERE token_sha256 = :digest "
    "ON CONFLICT (token_id) DO UPDATE SET last_used_at = excluded.last_used_at "
    "WHERE api_token_uses.last_used_at <= :stale")


def due_for_use_note(digest: str, now: dt.datetime) -> bool:
    """Has this process not written the token's last use for a minute? (Claims the write when so.)"""
    with _last_written_lock:
        last = _last_written.get(digest)
        if last is not None and now - last < LAST_USE_EVERY:
            return False
        if len(_last_written) > 10_000:
            _last_written.clear()  # bounded: forgetting only costs an UPDATE that finds nothing to do
        _last_written[digest] = now
        return True


def note_token_use(digest: str, now: dt.datetime) -> None:
    """Record that a token was used now, at most once a minute. Never in api_tokens (see ApiTokenUse), and on a
    connection of its own: the request's session and whatever it holds are left alone. A failure here is
    logged, never the request's."""
    if not due_for_use_note(digest, now):
        return
    try:
        with db.engine.begin() as connection:
            connection.execute(_NOTE_USE, {"now": now, "digest": digest, "stale": now - LAST_USE_EVERY})
    except SQLAlchemyError as exc:
        log.warning("could not record a token's last use: %s", type(exc).__name__)


def revoke_token(token: ApiToken, actor=None) -> bool:
    """Revoked at once: the API's token lookup skips revoked tokens. False when it already was."""
    if token.revoked_at is not None:
        return False
    token.revoked_at = current_app.config["CLOCK"].now()
    audit.record("token.revoked", team_id=token.team_id, target=f"token:{token.display_prefix}", actor=actor)
    db.session.commit()
    return True


# The CLI acts as the system; its audit entries say it came from the command line.
CLI = ("system", "cli")
