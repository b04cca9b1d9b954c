"""The audit log: who changed what, when, on which subscription, filtered; newest first, page by page."""

from __future__ import annotations

import datetime as dt
import re

from flask import abort, render_template, request, url_for
from flask_login import current_user, login_required
from sqlalchemy import and_, or_, select

from dashboard.accounts import access
from dashboard.audit import ACCOUNT_ACTIONS
from dashboard.consumers import service as consumer_service
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError, parse_time
from dashboard.models import CONSUMER_UID_PATTERN, AuditEntry, Replay, ReplayKind, Subscription, Team
from dashboard.operations.notifications import masked
from dashboard.schemas import CONSUMER_UID_WORDS
from dashboard.web.pages import bp

PAGE = 50
# Keys whose values are never shown, whatever an entry carries (entries should hold none: belt and braces).
HIDDEN_KEYS = ("secret", "password", "token", "ciphertext")
_CONSUMER_UID = re.compile(CONSUMER_UID_PATTERN)


def _shown(key: str, value, sink: bool) -> str:
    """One value as the log shows it: secrets never, a sink's URL masked (a Slack webhook is a credential)."""
    if any(word in key.lower() for word in HIDDEN_KEYS) and key not in ("token_name",):
        return "(hidden)"
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{_words(k)} {_shown(k, v, sink)}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(_shown(key, v, sink) for v in value) or "none"
    if sink and "url" in key.lower() and isinstance(value, str):
        return masked(value)
    return str(value)


def _words(key: str) -> str:
    return key.replace("_", " ")


def _replay_summary(action: str, detail: dict, deliveries: int | None = None, recover: bool = False) -> str | None:
    """A replay's, discard's or recover's counts as the replay page says them; None for other entries. A recover
    that is cancelled or fails is logged as `replay.cancelled` or `replay.failed`: `recover` says it was one."""
    n = {k: v for k, v in detail.items() if isinstance(v, int)}
    if action == "recover.started" and isinstance(detail.get("consumer"), str) and detail.get("since"):
        since = parse_time(detail["since"], "since")
        return (f"Replay since {since:%Y-%m-%d %H:%M:%S} UTC for consumer {detail['consumer']}: {deliveries or 0} "
                "events its endpoint never received or that died, to send")
    if action == "recover.finished" and "delivered" in n:
        return (f"{n['requeued']} events queued for the endpoint: {n['delivered']} delivered, "
                f"{n['failed']} failed (dead), {n['waiting']} still on their way, {n['held']} held until resume")
    if action == "replay.finished" and "delivered" in n:
        return (f"{n['delivered']} of {n['requeued']} delivered, {n['failed']} failed (dead again), "
                f"{n['waiting']} still on their way, {n['held']} held until resume")
    if action.startswith("replay.") and action != "replay.started" and "total" in n:  # cancelled, failed, older
        requeued = n.get("requeued", n["total"] if action == "replay.finished" else None)
        what = "events queued for the endpoint" if recover else "dead letters re-queued"
        return f"{requeued} of {n['total']} {what}" if requeued is not None else None
    if action.startswith("discard.") and "discarded" in n:
        return f"{n['discarded']} of {n.get('total', n['discarded'])} dead letters discarded"
    return None


def _was_recover(entry: AuditEntry) -> bool:
    """Whether a cancelled or failed replay's entry is a recover's (those few entries read their replay's kind)."""
    if entry.action not in ("replay.cancelled", "replay.failed") or not (entry.target or "").startswith("replay:"):
        return False
    return db.session.scalar(select(Replay.kind).where(Replay.id == entry.target[len("replay:"):])) \
        == ReplayKind.RECOVER


def detail_rows(entry: AuditEntry, sink_team_id: int | None) -> dict:
    """An entry's detail for the page: `summary` a sentence for the entries that have one (a replay's counts),
    `changes` is [(field, before, after)] for an edit (each changed field's old and new value), `facts` is
    [(key, value)] for the rest, keys and values in words."""
    detail = dict(entry.detail or {})
    summary = _replay_summary(entry.action, detail, entry.deliveries, recover=_was_recover(entry))
    if summary is not None:
        detail = {k: v for k, v in detail.items() if k == "error"}
    sink = sink_team_id is not None and entry.team_id == sink_team_id
    changes = []
    before, after = detail.pop("before", None), detail.pop("after", None)
    if isinstance(before, dict) and isinstance(after, dict):
        for field in sorted(set(before) | set(after)):
            changes.append((field, _shown(field, before.get(field), sink), _shown(field, after.get(field), sink)))
    elif before is not None or after is not None:
        detail.update({"before": before, "after": after})
    if "from" in detail and "to" in detail:  # a role change
        changes.append(("role", _shown("role", detail.pop("from"), sink), _shown("role", detail.pop("to"), sink)))
    return {"summary": summary, "changes": changes,
            "facts": [(_words(k), _shown(k, v, sink)) for k, v in detail.items()]}


@bp.app_context_processor
def _audit_detail():
    """`audit_detail(entry)` for audit/_entries.html, wherever it is included (the log, a subscription's page)."""
    found = []

    def audit_detail(entry):
        if not found:  # the sink team's id, read once per page
            found.append(access.system_team_id())
        return detail_rows(entry, found[0])

    return {"audit_detail": audit_detail}


def _time(name: str) -> dt.datetime | None:
    try:
        return parse_time((request.args.get(name) or "").strip(), name)
    except ApiError as exc:
        abort(exc.status, exc.message)


def _cursor(value: str | None) -> tuple[dt.datetime, int] | None:
    """`before` is the last entry of the previous page, as "<at>~<id>": entries are ordered by (at, id)."""
    if not value:
        return None
    at, _, entry_id = value.rpartition("~")
    try:
        return dt.datetime.fromisoformat(at), int(entry_id)
    except ValueError:
        abort(400, "before must be the link from the previous page")


def visible_entries(user):
    """A WHERE clause for the entries this user may read: their teams' (access.visible_to), except sign-ins and
    password changes, which admins see all of and everyone else only their own."""
    if access.is_admin(user):
        return None
    own_account = and_(AuditEntry.action.in_(ACCOUNT_ACTIONS), AuditEntry.actor == user.email,
                       AuditEntry.actor_kind.in_(("user", "anonymous")))
    teams = access.visible_to(user, AuditEntry.team_id)
    others = AuditEntry.action.not_in(ACCOUNT_ACTIONS)
    return or_(own_account, and_(others, teams) if teams is not None else others)


def visible_teams() -> list[Team]:
    return db.session.scalars(access.restrict(select(Team), current_user, Team.id).order_by(Team.name)).all()


def _of_consumer(uid: str, team_name: str, teams: list[Team]):
    """The entries about a consumer: its own ("consumer:<uid>") and its subscriptions', within its team (the one
    chosen, or the user's only one)."""
    if not _CONSUMER_UID.match(uid):
        abort(400, f"consumer must be {CONSUMER_UID_WORDS}")
    team = next((t for t in teams if t.name == team_name), None) if team_name else \
        (teams[0] if len(teams) == 1 else None)
    if team is None:
        abort(400, f"choose the team of consumer {uid!r}: a uid names a consumer within one team")
    subscriptions = select(Subscription.id).where(Subscription.team_id == team.id,
                                                  Subscription.consumer_id.in_(consumer_service.ids_named(team.id, uid)))
    return and_(AuditEntry.team_id == team.id,
                or_(AuditEntry.target == f"consumer:{uid}", AuditEntry.subscription_id.in_(subscriptions)))


@bp.get("/audit")
@login_required
def audit():
    teams = visible_teams()
    filters = {name: (request.args.get(name) or "").strip()
               for name in ("actor", "action", "subscription", "team", "consumer")}
    clause = visible_entries(current_user)
    query = select(AuditEntry) if clause is None else select(AuditEntry).where(clause)
    if filters["actor"]:
        query = query.where(AuditEntry.actor == filters["actor"].lower() if "@" in filters["actor"]
                            else AuditEntry.actor == filters["actor"])
    if filters["action"]:
        query = query.where(AuditEntry.action == filters["action"])
    if filters["subscription"]:
        query = query.where(AuditEntry.subscription_id == filters["subscription"])
    if filters["team"]:
        team = next((t for t in teams if t.name == filters["team"]), None)
        if team is None:
            abort(404)  # not a team this user may see
        query = query.where(AuditEntry.team_id == team.id)
    if filters["consumer"]:
        query = query.where(_of_consumer(filters["consumer"], filters["team"], teams))
    since, until = _time("since"), _time("until")
    if since:
        query = query.where(AuditEntry.at >= since)
    if until:
        query = query.where(AuditEntry.at < until)
    before = _cursor(request.args.get("before"))
    if before:
        query = query.where(or_(AuditEntry.at < before[0], and_(AuditEntry.at == before[0], AuditEntry.id < before[1])))
    rows = db.session.scalars(query.order_by(AuditEntry.at.desc(), AuditEntry.id.desc()).limit(PAGE + 1)).all()
    entries = rows[:PAGE]
    older_url = None
    if len(rows) > PAGE:
        kept = {k: v for k, v in request.args.items() if k != "before" and v}
        older_url = url_for(".audit", **kept, before=f"{entries[-1].at.isoformat()}~{entries[-1].id}")
    return render_template("audit/page.html", audit_entries=entries, filters=filters, teams=teams,
                           since=request.args.get("since", ""), until=request.args.get("until", ""),
                           older_url=older_url)
