"""Incidents: rules evaluated once a minute by the sweeper, one incident per cause.

| rule            | fires when (defaults; owners and admins override per subscription)        |
|-----------------|----------------------------------------------------------------------------|
| `dead_letters`  | at least 5 dead letters in 15 min                                          |
| `failure_rate`  | at least 50 % of attempts failed over 15 min, with at least 20 attempts    |
| `failing_since` | no success for 60 min while attempts keep failing                          |
| `backlog`       | the oldest due delivery has waited more than 10 min (Promesa's own health) |

An incident opens when its rule fires and no unresolved incident exists for that subscription and
rule (a unique index says so too, for two sweepers at once); while the rule keeps firing, its
figures and last_seen_at follow; once the rule has been false for a whole window, it resolves by
itself. Opening, acknowledging and resolving are notified (dashboard.notifications).

Evaluation is cheap: one grouped query over outcome_counts per window in use (usually one, for
both dead_letters and failure_rate), the folded streaks for failing_since, and one indexed
query for the backlog.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from dataclasses import dataclass, replace

from flask import current_app
from sqlalchemy import case, func, select
from sqlalchemy.exc import IntegrityError

from . import audit, autodisable, health, notifications
from .clock import iso
from .extensions import db
from .models import (Delivery, DeliveryState, Incident, IncidentRule, IncidentState, OutcomeCount, Subscription,
                     SubscriptionHealth)
from .outcomes import minute_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Setting:
    rule: str
    enabled: bool
    threshold: float | None
    window_minutes: int
    min_attempts: int | None

    def describe(self) -> str:
        if self.rule == "dead_letters":
            return f"at least {self.threshold:g} dead letters in {self.window_minutes} min"
        if self.rule == "failure_rate":
            return (f"at least {self.threshold:g} % of attempts failed over {self.window_minutes} min, "
                    f"with at least {self.min_attempts} attempts")
        if self.rule == "failing_since":
            return f"no success for {self.window_minutes} min while attempts keep failing"
        return f"the oldest due delivery has waited more than {self.window_minutes} min"


# The rules a subscription can tune, with their defaults; `backlog` is Promesa's own (PROMESA_BACKLOG_ALERT_MINUTES).
DEFAULTS = {
    "dead_letters": Setting("dead_letters", True, 5, 15, None),
    "failure_rate": Setting("failure_rate", True, 50, 15, 20),
    "failing_since": Setting("failing_since", True, None, 60, None),
}
TITLES = {"dead_letters": "Dead letters piling up", "failure_rate": "High failure rate",
          "failing_since": "No success for a while", "backlog": "Delivery backlog"}
# What a setting may be: (lowest, highest) for threshold, window and minimum attempts, per rule.
LIMITS = {
    "dead_letters": {"threshold": (1, 1_000_000), "window_minutes": (1, 1440)},
    "failure_rate": {"threshold": (1, 100), "window_minutes": (1, 1440), "min_attempts": (1, 1_000_000)},
    "failing_since": {"window_minutes": (5, 10080)},
}


def backlog_setting() -> Setting:
    return Setting("backlog", True, None, int(current_app.config["PROMESA_BACKLOG_ALERT_MINUTES"]), None)


def settings_for(subscription_ids) -> dict[str, dict[str, Setting]]:
    """Each subscription's effective rules: the defaults, with its own overrides applied."""
    out = {sub: dict(DEFAULTS) for sub in subscription_ids}
    for ids in health.chunks(list(out)):
        for row in db.session.scalars(select(IncidentRule).where(IncidentRule.subscription_id.in_(ids))):
            default = DEFAULTS.get(row.rule)
            if default is None:
                continue
            out[row.subscription_id][row.rule] = replace(
                default, enabled=row.enabled,
                threshold=row.threshold if row.threshold is not None else default.threshold,
                window_minutes=row.window_minutes or default.window_minutes,
                min_attempts=row.min_attempts or default.min_attempts)
    return out


def setting_of(incident: Incident) -> Setting:
    if incident.rule == "backlog":
        return backlog_setting()
    return settings_for([incident.subscription_id])[incident.subscription_id][incident.rule]


def save_rule(sub: Subscription, rule: str, form, actor: str) -> Setting:
    """Validate a rule form (enabled, threshold, window_minutes, min_attempts) and store it;
    raises ValueError saying what is wrong, and stores nothing then."""
    if rule not in DEFAULTS:
        raise ValueError(f"unknown rule {rule!r}; the rules are {', '.join(DEFAULTS)}")
    values = {}
    for field, (low, high) in LIMITS[rule].items():
        raw = (form.get(field) or "").strip()
        if not raw:
            values[field] = None  # the default
            continue
        try:
            number = float(raw) if field == "threshold" else int(raw)
        except ValueError:
            raise ValueError(f"{field.replace('_', ' ')} must be a number from {low} to {high}") from None
        if not low <= number <= high:
            raise ValueError(f"{field.replace('_', ' ')} must be from {low} to {high}")
        values[field] = number
    row = db.session.get(IncidentRule, (sub.id, rule)) or IncidentRule(subscription_id=sub.id, rule=rule)
    row.enabled = form.get("enabled") == "on"
    row.threshold, row.window_minutes, row.min_attempts = (values.get(k) for k in ("threshold", "window_minutes",
                                                                                   "min_attempts"))
    row.updated_at = current_app.config["CLOCK"].now()
    row.updated_by = actor
    db.session.add(row)
    audit.record("incident_rule.changed", subscription=sub, target=f"rule:{rule}",
                 detail={"enabled": row.enabled, **{k: v for k, v in values.items() if v is not None}})
    db.session.commit()
    return settings_for([sub.id])[sub.id][rule]


# -- evaluation ------------------------------------------------------------------------
def evaluate(app, now: dt.datetime | None = None) -> None:
    """The sweeper's minute: fold what is new, check every rule, disable what has failed for days,
    tell teams about new dead letters, fold attempt latencies. A step that fails is logged and
    the next ones still run (the next pass tries it again)."""
    now = now or app.config["CLOCK"].now()
    with app.app_context():
        for step in (health.fold_outcomes, check_rules, autodisable.check, notifications.publish_dead_letters,
                     lambda _now: health.fold_latency()):
            try:
                step(now)
            except Exception:  # noqa: BLE001 - one failing step must not stop the others; logged loudly
                log.exception("incident evaluation step %s failed", getattr(step, "__name__", step))
                db.session.rollback()
        db.session.remove()


@dataclass
class Fired:
    team_id: int | None
    figures: dict
    first_seen_at: dt.datetime


def window_figures(ids: list[str], since: dt.datetime) -> dict[str, tuple]:
    """Per subscription since a minute: (succeeded, failed, dead, first dead minute, first failed minute)."""
    T = OutcomeCount.__table__
    out = {}
    for chunk in health.chunks(ids):
        rows = db.session.execute(
            select(T.c.subscription_id, func.sum(T.c.succeeded), func.sum(T.c.failed), func.sum(T.c.dead),
                   func.min(case((T.c.dead > 0, T.c.minute))), func.min(case((T.c.failed > 0, T.c.minute))))
            .where(T.c.subscription_id.in_(chunk), T.c.minute >= minute_of(since))
            .group_by(T.c.subscription_id))
        for sub, succeeded, failed, dead, first_dead, first_failed in rows:
            out[sub] = (int(succeeded or 0), int(failed or 0), int(dead or 0), first_dead, first_failed)
    return out


def firing(now: dt.datetime, subs, settings) -> dict[tuple[str | None, str], Fired]:
    """Every (subscription id or None, rule) whose rule is true now, with its figures."""
    fired: dict[tuple[str | None, str], Fired] = {}
    teams = {sub_id: team_id for sub_id, team_id in subs}
    by_window = defaultdict(set)
    for sub_id, _ in subs:
        for rule in ("dead_letters", "failure_rate"):
            s = settings[sub_id][rule]
            if s.enabled:
                by_window[s.window_minutes].add(sub_id)
    for window, ids in by_window.items():
        for sub_id, (succeeded, failed, dead, first_dead, first_failed) in window_figures(
                sorted(ids), now - dt.timedelta(minutes=window)).items():
            s = settings[sub_id]["dead_letters"]
            if s.enabled and s.window_minutes == window and dead >= s.threshold:
                fired[(sub_id, s.rule)] = Fired(teams[sub_id], {
                    "dead": dead, "threshold": s.threshold, "window_minutes": window}, first_dead or now)
            s = settings[sub_id]["failure_rate"]
            attempts = succeeded + failed
            if (s.enabled and s.window_minutes == window and attempts and attempts >= s.min_attempts
                    and failed * 100 >= s.threshold * attempts):
                fired[(sub_id, s.rule)] = Fired(teams[sub_id], {
                    "failed": failed, "attempts": attempts, "failed_percent": round(100 * failed / attempts, 1),
                    "threshold": s.threshold, "min_attempts": s.min_attempts, "window_minutes": window},
                    first_failed or now)
    streaks = db.session.execute(select(SubscriptionHealth.subscription_id, SubscriptionHealth.failing_since,
                                        SubscriptionHealth.last_failure_at, SubscriptionHealth.streak_failures)
                                 .where(SubscriptionHealth.failing_since.is_not(None))).all()
    for sub_id, since, last_failure, failures in streaks:
        s = settings.get(sub_id, {}).get("failing_since")
        if s is None or not s.enabled:
            continue
        window = dt.timedelta(minutes=s.window_minutes)
        if since <= now - window and last_failure >= now - window:  # failing all along, and still trying
            fired[(sub_id, s.rule)] = Fired(teams[sub_id], {
                "failing_since": iso(since), "failed_attempts": failures, "window_minutes": s.window_minutes}, since)
    backlog = backlog_setting()
    due = (Delivery.state.in_(DeliveryState.DUE), Delivery.next_attempt_at <= now)
    oldest = db.session.scalar(select(func.min(Delivery.next_attempt_at)).where(*due))
    if oldest is not None and now - oldest > dt.timedelta(minutes=backlog.window_minutes):
        waiting = db.session.scalar(select(func.count()).select_from(Delivery).where(*due))
        fired[(None, "backlog")] = Fired(None, {
            "oldest_waited_minutes": round((now - oldest).total_seconds() / 60, 1), "due": waiting,
            "window_minutes": backlog.window_minutes}, oldest)
    return fired


def check_rules(now: dt.datetime) -> None:
    subs = db.session.execute(select(Subscription.id, Subscription.team_id)).all()
    settings = settings_for([sub_id for sub_id, _ in subs])
    fired = firing(now, subs, settings)
    unresolved = {(i.subscription_id, i.rule): i
                  for i in db.session.scalars(select(Incident).where(Incident.resolved_at.is_(None)))}
    for key, found in fired.items():
        incident = unresolved.get(key)
        if incident is not None:
            incident.last_seen_at, incident.figures = now, found.figures
            continue
        incident = Incident(subscription_id=key[0], team_id=found.team_id, rule=key[1], state=IncidentState.OPEN,
                            opened_at=now, first_seen_at=found.first_seen_at, last_seen_at=now,
                            figures=found.figures)
        try:
            with db.session.begin_nested():
                db.session.add(incident)
        except IntegrityError:
            continue  # another sweeper opened it a moment ago
        audit.record("incident.opened", team_id=found.team_id, actor=audit.SYSTEM, target=f"incident:{incident.id}",
                     detail={"rule": incident.rule, "figures": found.figures},
                     subscription=_sub_ref(incident))
        notifications.incident_changed(incident, "opened")
    for key, incident in unresolved.items():
        if key in fired:
            continue
        setting = (backlog_setting() if incident.rule == "backlog"
                   else settings.get(incident.subscription_id, {}).get(incident.rule))
        gone = setting is None or not setting.enabled  # subscription deleted, or the rule switched off
        if gone or now - incident.last_seen_at >= dt.timedelta(minutes=setting.window_minutes):
            incident.state, incident.resolved_at = IncidentState.RESOLVED, now
            audit.record("incident.resolved", team_id=incident.team_id, actor=audit.SYSTEM,
                         target=f"incident:{incident.id}", subscription=_sub_ref(incident))
            notifications.incident_changed(incident, "resolved")
    db.session.commit()


class _SubRef:
    """What audit.record reads of a subscription (id, team), without loading it."""

    def __init__(self, sub_id, team_id):
        self.id, self.team_id = sub_id, team_id


def _sub_ref(incident: Incident):
    return _SubRef(incident.subscription_id, incident.team_id) if incident.subscription_id else None


def acknowledge(incident: Incident, who: str) -> bool:
    """Someone is on it. Returns False when it was already acknowledged or resolved."""
    if incident.state != IncidentState.OPEN:
        return False
    incident.state = IncidentState.ACKNOWLEDGED
    incident.acknowledged_at = current_app.config["CLOCK"].now()
    incident.acknowledged_by = who
    audit.record("incident.acknowledged", team_id=incident.team_id, target=f"incident:{incident.id}",
                 subscription=_sub_ref(incident))
    notifications.incident_changed(incident, "acknowledged")
    db.session.commit()
    return True


def open_count(user) -> int:
    """Unresolved incidents this user may see (the nav badge)."""
    from . import access  # noqa: PLC0415

    query = access.restrict(select(func.count()).select_from(Incident).where(Incident.resolved_at.is_(None)),
                            user, Incident.team_id)
    return db.session.scalar(query) or 0
