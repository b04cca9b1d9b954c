"""Who may do what: the one place every dashboard view asks. The README's role table mirrors it,
and tests/test_access_matrix.py checks every route against it for every role.

| role     | sees                | changes                                                        |
|----------|---------------------|----------------------------------------------------------------|
| admin    | every team          | everything: users, tokens, sinks, quotas, subscriptions        |
|          |                     | (only admins see the notification sinks' own subscriptions)    |
| operator | every team          | pause, resume, disable, enable, replay, run receiver checks; acknowledges incidents |
| oncall   | every team          | acknowledges incidents; nothing else                           |
| owner    | own team            | own team's subscriptions (edit, rotate, delete, test, pause, replay, check) and tokens |
| member   | own team            | nothing                                                        |
"""

from __future__ import annotations

from flask import abort
from flask_login import current_user
from sqlalchemy import or_, select

from dashboard.core.extensions import db
from dashboard.models import (
    ROLES,  # noqa: F401  (the role names, beside User)
    Subscription,
    Team,
)

# What each role may do, in words: the Users page shows these (the table above says the same).
ROLE_DESCRIPTIONS = {
    "admin": "Every team. Everything: users, tokens, notification sinks, every subscription.",
    "operator": "Every team. Repairs: pause, resume, disable, enable, replay; acknowledges, snoozes and "
                "resolves incidents. Does not edit subscriptions.",
    "oncall": "Every team. Reads everything; acknowledges, snoozes and resolves incidents. Changes nothing else.",
    "owner": "One team. Its subscriptions (create, edit, rotate secrets, test, delete, pause, replay), its "
             "tokens and its incidents.",
    "member": "One team. Reads its pages; acknowledges, snoozes and resolves its incidents; changes nothing else.",
}

# Roles that see every team's pages.
GLOBAL_READERS = frozenset({"admin", "operator", "oncall"})
# The team that owns the notification sinks: their URLs are credentials (a Slack webhook), for admins only.
SYSTEM_TEAM = "promesa-system"
# Roles that may pause, resume, disable and replay anywhere.
GLOBAL_OPERATORS = frozenset({"admin", "operator"})


def _own_team(user, team_id) -> bool:
    return user.team_id is not None and team_id is not None and user.team_id == team_id


def _is_system_team(team_id) -> bool:
    team = db.session.get(Team, team_id) if team_id is not None else None
    return team is not None and team.name == SYSTEM_TEAM


def system_team_id() -> int | None:
    """The id of the team that owns the notification sinks (None before the first sink)."""
    return db.session.scalar(select(Team.id).where(Team.name == SYSTEM_TEAM))


def hidden_team_id(user) -> int | None:
    """The team this user sees nothing of while seeing every other (the system team, for all but admins)."""
    if user.role == "admin" or user.role not in GLOBAL_READERS:
        return None
    return system_team_id()


def can_view_team(user, team_id) -> bool:
    if user.role == "admin":
        return True
    if user.role in GLOBAL_READERS:
        return not _is_system_team(team_id)
    return _own_team(user, team_id)


def can_view(user, sub) -> bool:
    return can_view_team(user, sub.team_id)


def can_operate(user, sub) -> bool:
    """Pause, resume, disable, enable, replay, run a receiver check: operators and admins anywhere, owners
    on their own team."""
    return user.role in GLOBAL_OPERATORS or (user.role == "owner" and _own_team(user, sub.team_id))


def operable_team_ids(user) -> list[int] | None:
    """The teams whose subscriptions this user may operate (as can_operate): None means every team."""
    if user.role in GLOBAL_OPERATORS:
        return None
    return [user.team_id] if user.role == "owner" and user.team_id is not None else []


def can_edit(user, sub) -> bool:
    """Change what a subscription is (url, types, secret, limits), delete it, send it a test event:
    owners of its team and admins. Operators repair; they do not redefine."""
    return user.role == "admin" or (user.role == "owner" and _own_team(user, sub.team_id))


def can_create_in(user, team_id) -> bool:
    """Create a subscription for a team: its owners, and admins (never for the sinks' own team)."""
    if team_id is None or _is_system_team(team_id):
        return False
    return user.role == "admin" or (user.role == "owner" and _own_team(user, team_id))


def can_acknowledge(user, team_id) -> bool:
    """Acknowledge an incident: on-call, operators, admins, and the owning team."""
    return user.role in GLOBAL_READERS or _own_team(user, team_id)


def can_manage_tokens(user, team_id) -> bool:
    return user.role == "admin" or (user.role == "owner" and _own_team(user, team_id))


def is_admin(user) -> bool:
    return user.role == "admin"


def visible_to(user, team_column):
    """A WHERE clause that keeps only the rows of teams this user may see (None: every team)."""
    if user.role == "admin":
        return None
    if user.role in GLOBAL_READERS:
        # Rows of no team (Promesa's own backlog incidents, system audit entries) are every reader's.
        return or_(team_column.is_(None),
                   team_column.not_in(select(Team.id).where(Team.name == SYSTEM_TEAM).scalar_subquery()))
    return team_column == (user.team_id if user.team_id is not None else -1)


def restrict(query, user, team_column):
    clause = visible_to(user, team_column)
    return query if clause is None else query.where(clause)


def visible_subscription(subscription_id: str, need=None):
    """The subscription if the signed-in user may see it (404 otherwise: another team's subscription
    does not exist, as far as they can tell), and 403 when `need` (e.g. can_operate) says no."""

    sub = db.session.get(Subscription, subscription_id)
    if sub is None or not can_view(current_user, sub):
        abort(404)
    if need is not None and not need(current_user, sub):
        abort(403)
    return sub


def of_subscription(model, object_id: str, sub):
    """The row of `model` (a delivery, a check) with this id if it belongs to `sub`; 404 otherwise."""
    row = db.session.get(model, object_id)
    if row is None or row.subscription_id != sub.id:
        abort(404)
    return row


def require(allowed: bool) -> None:
    if not allowed:
        abort(403)
