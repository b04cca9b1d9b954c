"""Who may do what: the one place every dashboard view asks.

ROLES_TABLE below says it in words; the Users page shows it, the README and docs/dashboard.md carry the same
table, and tests/web/test_access_matrix.py checks those copies against it and every route against the rules.
"""

from __future__ import annotations

import dataclasses

from flask import abort
from flask_login import current_user
from sqlalchemy import false, or_, select
from werkzeug.exceptions import Forbidden

from dashboard.core.extensions import db
from dashboard.models import (
    ROLES,  # noqa: F401  (the role names, beside User)
    Subscription,
    Team,
)

# Each role: (which teams it sees, what it may change). The Users page, the README and docs/dashboard.md say
# exactly this; on-call and members answer incidents (acknowledge, snooze, resolve) as PagerDuty's responders do.
ROLES_TABLE = {
    "admin": ("every team", "everything (users, tokens, notification sinks, quotas, every subscription and "
                            "incident)"),
    "operator": ("every team", "repairs (pause, resume, disable, enable, replay, discard, receiver checks); "
                               "acknowledges, snoozes and resolves incidents; does not edit subscriptions"),
    "oncall": ("every team", "acknowledges, snoozes and resolves incidents; nothing else"),
    "owner": ("own team", "its subscriptions (create, edit, rotate secrets, test, delete, repairs), its tokens; "
                          "acknowledges, snoozes and resolves its incidents"),
    "member": ("own team", "acknowledges, snoozes and resolves its incidents; nothing else"),
}

# Roles that see every team's pages.
GLOBAL_READERS = frozenset({"admin", "operator", "oncall"})
# The team that owns the notification sinks: their URLs are credentials (a Slack webhook), for admins only.
SYSTEM_TEAM = "promesa-system"
# Roles that may pause, resume, disable and replay anywhere.
GLOBAL_OPERATORS = frozenset({"admin", "operator"})


# Whoever holds a consumer portal session: one consumer of one team, never a dashboard user.
PORTAL = "portal"


@dataclasses.dataclass(frozen=True)
class PortalUser:
    """A consumer portal session (dashboard.consumers.portal) as Flask-Login's user: it sees and manages its
    consumer's own subscriptions, and nothing of its team, another consumer, or the dashboard."""

    session_token: str
    team_id: int
    consumer_id: int
    uid: str
    role: str = PORTAL
    email: None = None
    is_authenticated: bool = True
    is_active: bool = True
    is_anonymous: bool = False

    def get_id(self) -> str:
        return f"{PORTAL}:{self.session_token}"


def is_portal(user) -> bool:
    return getattr(user, "role", None) == PORTAL


def _consumers_own(user, sub) -> bool:
    return sub.team_id == user.team_id and sub.consumer_id is not None and sub.consumer_id == user.consumer_id


def _own_team(user, team_id) -> bool:
    if is_portal(user):
        return False  # a consumer is not its team
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
    if is_portal(user):
        return False
    if user.role == "admin":
        return True
    if user.role in GLOBAL_READERS:
        return not _is_system_team(team_id)
    return _own_team(user, team_id)


def can_view(user, sub) -> bool:
    if is_portal(user):
        return _consumers_own(user, sub)
    return can_view_team(user, sub.team_id)


def can_view_replay(user, replay) -> bool:
    """A bulk job's page (a replay, a discard, a replay since): as its team's; in the portal, only a job on one of
    its consumer's own subscriptions (a job spanning several subscriptions is never a consumer's)."""
    if is_portal(user):
        sub = db.session.get(Subscription, replay.subscription_id) if replay.subscription_id else None
        return sub is not None and replay.team_id == sub.team_id and _consumers_own(user, sub)
    return can_view_team(user, replay.team_id)


def can_operate(user, sub) -> bool:
    """Pause, resume, disable, enable, replay, run a receiver check: operators and admins anywhere, owners
    on their own team; a consumer, in its portal, on its own."""
    if is_portal(user):
        return _consumers_own(user, sub)
    return can_operate_team(user, sub.team_id)


def can_operate_team(user, team_id) -> bool:
    """Repair a team's things (its subscriptions, disable or enable its consumers): as can_operate."""
    return user.role in GLOBAL_OPERATORS or (user.role == "owner" and _own_team(user, team_id))


def operable_team_ids(user) -> list[int] | None:
    """The teams whose subscriptions this user may operate (as can_operate): None means every team."""
    if user.role in GLOBAL_OPERATORS:
        return None
    return [user.team_id] if user.role == "owner" and user.team_id is not None else []


def can_edit(user, sub) -> bool:
    """Change what a subscription is (url, types, secret, limits), delete it, send it a test event:
    owners of its team and admins, and its consumer in the portal. Operators repair; they do not redefine."""
    if is_portal(user):
        return _consumers_own(user, sub)
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
    if is_portal(user):
        return false()  # the portal lists its consumer's own rows by consumer, never a team's
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


class Refused(Forbidden):
    """A 403 that says what was refused and who may do it: the error page shows both to the person refused."""

    def __init__(self, action: str | None = None, who_may: str | None = None):
        super().__init__()
        self.action, self.who_may = action, who_may


# What each subscription rule guards, and who passes it, for the page that refuses someone.
RULE_WORDS = {
    can_operate: ("repair this subscription (pause, resume, disable, enable, replay, discard, check it)",
                  "operators and admins, and owners of its team"),
    can_edit: ("change this subscription (edit, rotate its secret, delete, send a test event)",
               "admins, and owners of its team"),
}


def visible_subscription(subscription_id: str, need=None):
    """The subscription if the signed-in user may see it (404 otherwise: another team's subscription
    does not exist, as far as they can tell), and 403 when `need` (e.g. can_operate) says no."""

    sub = db.session.get(Subscription, subscription_id)
    if sub is None or not can_view(current_user, sub):
        abort(404)
    if need is not None and not need(current_user, sub):
        raise Refused(*RULE_WORDS.get(need, (None, None)))
    return sub


def of_subscription(model, object_id: str, sub):
    """The row of `model` (a delivery, a check) with this id if it belongs to `sub`; 404 otherwise."""
    row = db.session.get(model, object_id)
    if row is None or row.subscription_id != sub.id:
        abort(404)
    return row


def require(allowed: bool, action: str | None = None, who_may: str | None = None) -> None:
    if not allowed:
        raise Refused(action, who_may)


def require_admin(action: str) -> None:
    require(is_admin(current_user), action, "admins")
