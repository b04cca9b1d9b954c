"""The audit log: every state change, from the dashboard, the API or the system, says who did it.

`record()` adds the entry to the current database session, so it commits (or rolls back) with the
change it describes. Code that writes through Core connections (the delivery engine, the sweeper)
inserts `entry_values(...)` in its own transaction instead.
"""

from __future__ import annotations

import datetime as dt

from flask import current_app, g, has_request_context, request

from dashboard.core.extensions import db
from dashboard.models import AuditEntry

SYSTEM = ("system", "system")
TARGET_MAX = AuditEntry.__table__.c.target.type.length

# One person's sign-ins and password changes: entries of no team, shown to admins and to the person they name alone.
ACCOUNT_ACTIONS = ("user.signed_in", "user.sign_in_failed", "user.locked_out", "user.password_changed",
                   "user.password_change_refused")


def current_actor() -> tuple[str, str]:
    """(kind, name) of whoever is acting in this request: a signed-in user, an API token, or the system."""
    if has_request_context():
        from flask_login import current_user

        if request.blueprint == "api" and g.get("api_token_prefix"):
            return "token", g.api_token_prefix
        if current_user and current_user.is_authenticated:
            if current_user.role == "portal":  # a consumer in its portal (dashboard.accounts.access.PortalUser)
                return "portal", current_user.uid
            return "user", current_user.email
    return SYSTEM


def entry_values(action: str, *, at: dt.datetime, actor: tuple[str, str] = SYSTEM, team_id: int | None = None,
                 subscription_id: str | None = None, target: str | None = None, deliveries: int | None = None,
                 detail: dict | None = None) -> dict:
    kind, name = actor
    if target is not None and len(target) > TARGET_MAX:
        target = target[:TARGET_MAX - 1] + "…"  # an event type's name may be longer than the column
    return {"at": at, "actor_kind": kind, "actor": name, "action": action, "team_id": team_id,
            "subscription_id": subscription_id, "target": target, "deliveries": deliveries, "detail": detail}


def record(action: str, *, subscription=None, team_id: int | None = None, target: str | None = None,
           deliveries: int | None = None, detail: dict | None = None,
           actor: tuple[str, str] | None = None) -> AuditEntry:
    """Add an entry to the session; it is written by the caller's commit, with the change itself."""
    if subscription is not None:
        team_id = subscription.team_id if team_id is None else team_id
    entry = AuditEntry(**entry_values(
        action, at=current_app.config["CLOCK"].now(), actor=actor or current_actor(), team_id=team_id,
        subscription_id=subscription.id if subscription is not None else None, target=target,
        deliveries=deliveries, detail=detail))
    db.session.add(entry)
    return entry
