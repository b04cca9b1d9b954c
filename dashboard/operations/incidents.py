"""Incidents: rules evaluated once a minute by the sweeper, one incident per cause.

| rule            | fires when (defaults; owners and admins override per subscription)        |
|-----------------|----------------------------------------------------------------------------|
| `dead_letters`  | at least 5 dead letters in 15 min                                          |
| `failure_rate`  | at least 50 % of attempts failed over 15 min, with at least 20 attempts    |
| `failing_since` | no success for 60 min while attempts keep failing                          |
| `backlog`       | the oldest due delivery has waited more than 10 min (Promesa's own health) |
| `certificate_expiring` | the subscription's client certificate expires within 14 days (fixed); resolves once replaced |

An incident opens when a rule fires and no unresolved incident exists for that subscription (a
unique index says so too, for two sweepers at once): one outage is one incident, whatever the
number of rules that fire, and it lists every one of them (`rules`). While they keep firing, their
figures and last_seen_at follow; once every one has been false for a whole window, it resolves by
itself. Opening, acknowledging and resolving are notified (dashboard.operations.notifications),
a sweep's burst grouped.

Evaluation is cheap: one grouped query over outcome_counts per window in use (usually one, for
both dead_letters and failure_rate), the folded streaks for failing_since, and one indexed
query for the backlog.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from dataclasses import dataclass

from flask import current_app
from sqlalchemy import case, func, or_, select
from sqlalchemy.exc import IntegrityError

from dashboard import audit
from dashboard.accounts import access
from dashboard.core.clock import iso
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.models import (
    INCIDENT_NOTE_MAX,
    Consumer,
    Delivery,
    DeliveryState,
    Incident,
    IncidentState,
    OutcomeCount,
    Subscription,
    SubscriptionHealth,
)
from dashboard.operations import notifications
from dashboard.operations.incident_rules import CERTIFICATE_EXPIRING, backlog_setting, settings_for
from dashboard.stats import folding
from dashboard.stats.outcomes import minute_of
from dashboard.subscriptions import client_tls

log = logging.getLogger(__name__)


# -- evaluation ------------------------------------------------------------------------
@dataclass
class Fired:
    team_id: int | None
    figures: dict
    first_seen_at: dt.datetime


def window_figures(ids: list[str], since: dt.datetime) -> dict[str, tuple]:
    """Per subscription since a minute: (succeeded, failed, dead, first dead minute, first failed minute)."""
    out = {}
    for chunk in folding.chunks(ids):
        rows = db.session.execute(
            select(OutcomeCount.subscription_id, func.sum(OutcomeCount.succeeded), func.sum(OutcomeCount.failed),
                   func.sum(OutcomeCount.dead), func.min(case((OutcomeCount.dead > 0, OutcomeCount.minute))),
                   func.min(case((OutcomeCount.failed > 0, OutcomeCount.minute))))
            .where(OutcomeCount.subscription_id.in_(chunk), OutcomeCount.minute >= minute_of(since))
            .group_by(OutcomeCount.subscription_id))
        for sub, succeeded, failed, dead, first_dead, first_failed in rows:
            out[sub] = (int(succeeded or 0), int(failed or 0), int(dead or 0), first_dead, first_failed)
    return out


def firing(now: dt.datetime, subs, settings) -> dict[tuple[str | None, str], Fired]:
    """Every (subscription id or None, rule) whose rule is true now, with its figures. `subs`: (id, team id,
    created_at) of every subscription."""
    fired: dict[tuple[str | None, str], Fired] = {}
    teams = {sub_id: team_id for sub_id, team_id, _ in subs}
    created = {sub_id: created_at for sub_id, _, created_at in subs}

    def first_sign(sub_id: str, minute: dt.datetime) -> dt.datetime:
        # Outcomes are counted per minute: a subscription's first minute starts before it existed.
        return max(minute, created[sub_id])

    by_window = defaultdict(set)
    for sub_id, _, _ in subs:
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
                    "dead": dead, "threshold": s.threshold, "window_minutes": window},
                    first_sign(sub_id, first_dead or now))
            s = settings[sub_id]["failure_rate"]
            attempts = succeeded + failed
            if (s.enabled and s.window_minutes == window and attempts and attempts >= s.min_attempts
                    and failed * 100 >= s.threshold * attempts):
                fired[(sub_id, s.rule)] = Fired(teams[sub_id], {
                    "failed": failed, "attempts": attempts, "failed_percent": round(100 * failed / attempts, 1),
                    "threshold": s.threshold, "min_attempts": s.min_attempts, "window_minutes": window},
                    first_sign(sub_id, first_failed or now))
    streaks = db.session.execute(select(SubscriptionHealth.subscription_id, SubscriptionHealth.failing_since,
                                        SubscriptionHealth.last_failure_at, SubscriptionHealth.streak_failures)
                                 .where(SubscriptionHealth.failing_since.is_not(None))).all()
    for sub_id, since, last_failure, failures in streaks:
        s = settings.get(sub_id, {}).get("failing_since")
        if s is None or not s.enabled:
            continue
        window = dt.timedelta(minutes=s.window_minutes)
        since = first_sign(sub_id, since)
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
    for found in client_tls.expiring(now):
        fired[(found.subscription_id, CERTIFICATE_EXPIRING.rule)] = Fired(found.team_id, {
            "subject": found.subject, "expires_at": iso(found.expires_at),
            "days_left": max(0, (found.expires_at - now).days)},
            first_sign(found.subscription_id, found.expires_at - client_tls.EXPIRY_WARNING))
    return fired


# Which of a subscription's rules names its incident when several fire at once.
RULE_ORDER = ("dead_letters", "failure_rate", "failing_since", "backlog", "certificate_expiring")


def rules_of(incident: Incident) -> dict:
    """Every rule that fired during the incident's outage: {rule: {"figures", "first_seen_at", "last_seen_at"}}."""
    return incident.rules or {incident.rule: {"figures": incident.figures, "first_seen_at": iso(incident.first_seen_at),
                                              "last_seen_at": iso(incident.last_seen_at)}}


def _read_iso(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.removesuffix("Z"))


def rules_last_seen(incident: Incident) -> list[tuple[str, dt.datetime]]:
    """Every rule of the incident, with when it was last seen true."""
    return [(rule, incident.last_seen_at if seen.get("last_seen_at") is None else _read_iso(seen["last_seen_at"]))
            for rule, seen in rules_of(incident).items()]


def _setting(incident: Incident, rule: str, settings):
    return backlog_setting() if rule == "backlog" else settings.get(incident.subscription_id, {}).get(rule)


def _quiet(incident: Incident, now: dt.datetime, settings) -> bool:
    """Has every rule of the incident been false for its whole window (or been switched off, or its
    subscription deleted)?"""
    for rule, last_seen in rules_last_seen(incident):
        setting = _setting(incident, rule, settings)
        if setting is not None and setting.enabled and now - last_seen < dt.timedelta(minutes=setting.window_minutes):
            return False
    return True


def check_rules(now: dt.datetime) -> None:
    """One outage of one subscription is one incident, whatever the number of its rules that fire: a rule that
    fires while its subscription's incident is unresolved joins it (and is listed in `rules`) without a
    notification; the incident resolves once all of them have been quiet for their windows."""
    subs = db.session.execute(select(Subscription.id, Subscription.team_id, Subscription.created_at)).all()
    settings = settings_for([sub_id for sub_id, _, _ in subs])
    fired = firing(now, subs, settings)
    by_sub: dict[str | None, dict[str, Fired]] = defaultdict(dict)
    for (sub_id, rule), found in fired.items():
        by_sub[sub_id][rule] = found
    unresolved = {i.subscription_id: i for i in db.session.scalars(select(Incident).where(Incident.resolved_at.is_(None)))}
    changes: list[tuple[Incident, str]] = []
    for sub_id, rules in by_sub.items():
        ordered = sorted(rules, key=lambda r: RULE_ORDER.index(r) if r in RULE_ORDER else len(RULE_ORDER))
        incident = unresolved.get(sub_id)
        if incident is not None:
            listed = dict(rules_of(incident))
            for rule in ordered:
                before = listed.get(rule, {})
                listed[rule] = {"figures": rules[rule].figures, "last_seen_at": iso(now),
                                "first_seen_at": before.get("first_seen_at") or iso(rules[rule].first_seen_at)}
            incident.rules, incident.last_seen_at = listed, now
            if incident.rule in rules:
                incident.figures = rules[incident.rule].figures
            continue
        first = rules[ordered[0]]
        incident = Incident(subscription_id=sub_id, team_id=first.team_id, rule=ordered[0], state=IncidentState.OPEN,
                            opened_at=now, first_seen_at=min(r.first_seen_at for r in rules.values()),
                            last_seen_at=now, figures=first.figures,
                            rules={rule: {"figures": rules[rule].figures, "first_seen_at": iso(rules[rule].first_seen_at),
                                          "last_seen_at": iso(now)} for rule in ordered})
        snoozed = _snooze_in_force(sub_id, now)
        if snoozed is not None:  # "ignore until": a cause snoozed before it resolved stays quiet when it returns
            incident.snoozed_until, incident.snoozed_by = snoozed.snoozed_until, snoozed.snoozed_by
        try:
            with db.session.begin_nested():
                db.session.add(incident)
        except IntegrityError:
            continue  # another sweeper opened it a moment ago
        audit.record("incident.opened", team_id=first.team_id, actor=audit.SYSTEM, target=f"incident:{incident.id}",
                     detail={"rule": incident.rule, "rules": ordered, "figures": first.figures}
                     | ({"consumer": uid} if (uid := consumer_uid(incident)) else {}),
                     subscription=_sub_ref(incident))
        changes.append((incident, "opened"))
    for sub_id, incident in unresolved.items():
        if sub_id in by_sub or not _quiet(incident, now, settings):
            continue
        incident.state, incident.resolved_at = IncidentState.RESOLVED, now
        audit.record("incident.resolved", team_id=incident.team_id, actor=audit.SYSTEM,
                     target=f"incident:{incident.id}", subscription=_sub_ref(incident))
        changes.append((incident, "resolved"))
    notifications.incidents_changed(changes)
    db.session.commit()


class _SubRef:
    """What audit.record reads of a subscription (id, team), without loading it."""

    def __init__(self, sub_id, team_id):
        self.id, self.team_id = sub_id, team_id


def _sub_ref(incident: Incident):
    return _SubRef(incident.subscription_id, incident.team_id) if incident.subscription_id else None


def _of_cause(sub_id: str | None):
    """The incidents of this subscription, or of Promesa's own health."""
    return Incident.subscription_id.is_(None) if sub_id is None else Incident.subscription_id == sub_id


def _snooze_in_force(sub_id: str | None, now: dt.datetime) -> Incident | None:
    """The latest incident of this subscription (or of Promesa's own health), if its snooze still runs."""
    return db.session.scalar(select(Incident).where(_of_cause(sub_id), Incident.snoozed_until > now)
                             .order_by(Incident.opened_at.desc()).limit(1))


def snoozed(incident: Incident, now: dt.datetime | None = None) -> bool:
    now = now or current_app.config["CLOCK"].now()
    return incident.snoozed_until is not None and incident.snoozed_until > now


def acknowledge(incident: Incident, who: str, note: str = "") -> int | None:
    """Someone is on it, optionally saying what they are doing. Returns how many sinks will be told; None when it
    was already acknowledged or resolved."""
    note = (note or "").strip()
    if len(note) > INCIDENT_NOTE_MAX:
        raise ApiError(400, f"the note must be at most {INCIDENT_NOTE_MAX} characters")
    if incident.state != IncidentState.OPEN:
        return None
    incident.state = IncidentState.ACKNOWLEDGED
    incident.acknowledged_at = current_app.config["CLOCK"].now()
    incident.acknowledged_by = who
    incident.acknowledged_note = note or None
    audit.record("incident.acknowledged", team_id=incident.team_id, target=f"incident:{incident.id}",
                 subscription=_sub_ref(incident), detail={"note": note} if note else None)
    told = notifications.incident_changed(incident, "acknowledged")
    db.session.commit()
    return told


MAX_SNOOZE = dt.timedelta(days=7)


def snooze(incident: Incident, who: str, until: dt.datetime) -> dt.datetime | None:
    """No notifications about it until then; it stays on the dashboard and still resolves by itself. If its cause
    resolves and returns before then, the new incident is snoozed too. A snooze already running is replaced, longer
    or shorter: returns when it would have ended (None when it was not snoozed), for the caller to say so."""
    now = current_app.config["CLOCK"].now()
    if incident.resolved_at is not None:
        raise ApiError(409, "this incident is resolved: there is nothing to snooze")
    if not now < until <= now + MAX_SNOOZE:
        raise ApiError(400, "snooze for between a minute and 7 days")
    was_until = incident.snoozed_until if snoozed(incident, now) else None
    incident.snoozed_until, incident.snoozed_by = until, who
    audit.record("incident.snoozed", team_id=incident.team_id, target=f"incident:{incident.id}",
                 subscription=_sub_ref(incident),
                 detail={"until": iso(until), **({"was_until": iso(was_until)} if was_until else {})})
    db.session.commit()
    return was_until


def end_snooze(incident: Incident) -> bool:
    """Notifications about it (and about its cause, should it return) resume now. False when it was not snoozed."""
    now = current_app.config["CLOCK"].now()
    if not snoozed(incident, now):
        return False
    was_until = incident.snoozed_until
    # The cause's earlier incidents carry the same snooze ("ignore until"): it ends for all of them.
    for running in db.session.scalars(select(Incident).where(_of_cause(incident.subscription_id),
                                                             Incident.snoozed_until > now)):
        running.snoozed_until, running.snoozed_by = None, None
    audit.record("incident.unsnoozed", team_id=incident.team_id, target=f"incident:{incident.id}",
                 subscription=_sub_ref(incident), detail={"was_until": iso(was_until)})
    db.session.commit()
    return True


def resolve(incident: Incident, who: str) -> int | None:
    """Resolved by hand (the cause is fixed, or it was noise). If the rule still fires, the sweeper opens a new
    incident. Returns how many sinks will be told; None when it was already resolved."""
    if incident.resolved_at is not None:
        return None
    incident.state, incident.resolved_at = IncidentState.RESOLVED, current_app.config["CLOCK"].now()
    incident.resolved_by = who
    audit.record("incident.resolved", team_id=incident.team_id, target=f"incident:{incident.id}",
                 subscription=_sub_ref(incident), detail={"by": "hand"})
    told = notifications.incident_changed(incident, "resolved")
    db.session.commit()
    return told


def open_count(user) -> int:
    """Open incidents nobody has acknowledged (or snoozed) that this user may see: the nav badge."""
    now = current_app.config["CLOCK"].now()
    query = access.restrict(select(func.count()).select_from(Incident).where(
        Incident.state == IncidentState.OPEN, Incident.resolved_at.is_(None),
        or_(Incident.snoozed_until.is_(None), Incident.snoozed_until <= now)), user, Incident.team_id)
    return db.session.scalar(query) or 0


def consumer_uid(incident: Incident) -> str | None:
    """The consumer whose endpoint the incident is about, by uid; None for a team's own endpoint or Promesa's
    own health."""
    if incident.subscription_id is None:
        return None
    return db.session.scalar(select(Consumer.uid).join(Subscription, Subscription.consumer_id == Consumer.id)
                             .where(Subscription.id == incident.subscription_id))


def describe_figures(incident: Incident, still_dead: int | None = None) -> list[str]:
    """The figures in words that say what they count ("147 dead-lettered in the 15-minute window, 43 still dead")."""
    f = incident.figures or {}
    window = f.get("window_minutes")
    in_window = f"in the {window}-minute window" if window else "in the window"
    out = []
    if "dead" in f:
        line = f"{f['dead']} dead-lettered {in_window}"
        if still_dead is not None:
            line += f", {still_dead} still dead"
        out.append(line + (f" (fires at {f['threshold']:g})" if isinstance(f.get("threshold"), (int, float)) else ""))
    if "attempts" in f:
        out.append(f"{f.get('failed', 0)} of {f['attempts']} attempts failed {in_window} "
                   f"({f.get('failed_percent', 0):g} %; fires at {f.get('threshold', 0):g} % of at least "
                   f"{f.get('min_attempts', 0)} attempts)")
    if "failing_since" in f:
        out.append(f"no success since {_read_iso(f['failing_since']):%Y-%m-%d %H:%M:%S} UTC, "
                   f"{f.get('failed_attempts', 0)} failed attempts in a row")
    if "due" in f:
        out.append(f"{f['due']} deliveries due; the oldest has waited {f.get('oldest_waited_minutes', 0):g} min")
    if "expires_at" in f:
        out.append(f"the client certificate {f.get('subject')} expires at {_read_iso(f['expires_at']):%Y-%m-%d %H:%M:%S} "
                   f"UTC, {f.get('days_left', 0)} days from now: replace it on the subscription")
    return out
