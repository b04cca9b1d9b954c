"""Notifications, through Promesa's own delivery machinery: retried, recorded, replayable, visible
like any delivery. A sink that is down does not lose an alert; its deliveries wait and retry.

Two audiences:
- **Sinks** that admins configure (`/sinks`, `promesa sinks add --kind slack|json --url URL`): each
  is a subscription of Promesa's own system team. A notification is one event per sink, whose body
  is what that sink reads: Slack's `{"text": ...}` for an incoming webhook, a thin event signed
  like every delivery for a JSON webhook. Sent on incident opened, acknowledged and resolved,
  automatic disable, and the end of a replay.
- **Teams**: a producer's own subscriptions that name an operational event type
  (`promesa.delivery.dead`, `promesa.subscription.disabled`, `promesa.incident.opened`,
  `promesa.incident.resolved`) get thin events about that team's subscriptions. A pattern must name
  `promesa.` itself: `*` does not match them, so no receiver gets them by surprise, and a dead letter
  of an operational event makes no new one (no chains).

`notify()` stages everything in the current database session: the events and deliveries commit with
the change they announce, and are handed to the workers when that session commits (never for a
rollback: queue.handoff.enqueue_after_commit).
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
import logging
from typing import Callable
from urllib.parse import urlencode, urlsplit

from flask import current_app
from promesa_receiver import signing
from sqlalchemy import select, update

from dashboard import audit
from dashboard.accounts import access
from dashboard.accounts import service as accounts
from dashboard.core import crypto
from dashboard.core.clock import iso
from dashboard.core.extensions import db
from dashboard.core.ids import new_ids
from dashboard.core.links import absolute
from dashboard.core.validation import ApiError
from dashboard.delivery.targets import url_problem
from dashboard.ingest.writing import Promised, delivery_rows, insert_rows, new_delivery_values, thin_body
from dashboard.models import (
    Consumer,
    Delivery,
    DeliveryState,
    Event,
    IncidentState,
    NotificationSink,
    OutcomeCount,
    Subscription,
    SubscriptionState,
    SweepMark,
    Team,
)
from dashboard.operations.incident_rules import setting_of, title
from dashboard.queue.handoff import enqueue_after_commit
from dashboard.stats import folding
from dashboard.subscriptions.service import hold

log = logging.getLogger(__name__)

SYSTEM_TEAM = access.SYSTEM_TEAM
SINK_KINDS = ("slack", "json")
# What sinks hear about, and what teams may subscribe to (as "promesa.<kind>").
SINK_NOTIFICATIONS = {"incident.opened", "incident.acknowledged", "incident.resolved", "subscription.disabled",
                      "replay.finished"}
TEAM_EVENTS = {"delivery.dead", "subscription.disabled", "incident.opened", "incident.resolved"}
TEAM_EVENT_TYPES = tuple(sorted(f"promesa.{kind}" for kind in TEAM_EVENTS))
# New dead letters are announced once this old: the engine's transaction that wrote one has committed.
DEAD_LETTER_LAG = dt.timedelta(minutes=1)
FIRST_LOOK_BACK = dt.timedelta(hours=1)  # how far back the very first pass looks
MAX_DEAD_LETTER_EVENTS = 10_000  # per pass; the rest wait for the next one


def store_events(team_id: int, event_type: str, data: dict, bodies: dict[str, Callable[[str], str]]) -> int:
    """Add events of one team and their deliveries to the session. `bodies`: subscription id -> a
    function of the event id that returns the exact body to send (Event.body is the bytes sent);
    subscriptions given the same function share one event. Returns how many deliveries were staged."""
    if not bodies:
        return 0
    now = current_app.config["CLOCK"].now()
    states = dict(db.session.execute(select(Subscription.id, Subscription.state)
                                     .where(Subscription.id.in_(list(bodies)))).all())
    by_builder: dict[Callable, list[str]] = {}
    for sub_id, build in bodies.items():
        if sub_id in states:
            by_builder.setdefault(build, []).append(sub_id)
    event_rows, promised = [], []
    for (build, sub_ids), event_id in zip(by_builder.items(), new_ids("evt", len(by_builder))):
        event_rows.append({"key": event_id, "id": event_id, "type": event_type, "data": data, "body": build(event_id),
                           "occurred_at": now})
        promised += [Promised(event_id, sub_id, states[sub_id] == SubscriptionState.ACTIVE) for sub_id in sub_ids]
    deliveries, ready = delivery_rows(promised)
    if event_rows:
        insert_rows(Event.__table__, event_rows, same={"team_id": team_id, "version": 1, "idempotency_key": None,
                                                       "created_at": now})
        insert_rows(Delivery.__table__, deliveries, same=new_delivery_values(now))
    enqueue_after_commit(ready)
    return len(deliveries)


def slack_escape(text: str) -> str:
    """Slack's three control characters, escaped as Slack asks: text from receivers stays text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _thin(event_type: str, data: dict):
    timestamp = iso(current_app.config["CLOCK"].now())
    payload = json.dumps(data, separators=(",", ":"))
    return lambda event_id: thin_body(event_id, event_type, 1, timestamp, payload)


def notify(kind: str, *, text: str, path: str, data: dict, team_id: int | None = None, to_sinks: bool = True,
           not_to: frozenset[str] = frozenset()) -> int:
    """Stage a notification: to every sink (when `kind` is one sinks hear about) and to the team's own
    subscriptions that ask for `promesa.<kind>` (when it is one of TEAM_EVENTS and a team is given).
    `text`: one line for people (Slack); `path`: the dashboard page it is about; `data`: ids and
    times only. Enqueued when the session commits. Returns how many deliveries were staged.

    The end of a replay, for example: notify("replay.finished", text="Replay of 40 dead letters
    finished: 40 delivered", path=f"/subscriptions/{sub.id}", data={"subscription_id": sub.id,
    "replayed": 40}). `to_sinks`: False for the team alone; `not_to`: sinks' subscriptions left out (a failing
    sink is not told about itself)."""
    event_type = f"promesa.{kind}"
    data = {**data, "url": absolute(path)}
    thin = _thin(event_type, data)
    staged = 0
    if kind in SINK_NOTIFICATIONS and to_sinks:
        sinks = sinks_hearing(kind, team_id, not_to)
        if sinks:
            message = json.dumps({"text": f"{slack_escape(text)} <{slack_escape(absolute(path))}|Open in Promesa>"})
            slack = lambda _event_id: message  # noqa: E731 - Slack reads its own shape, without our id
            bodies = {sub_id: slack if sink_kind == "slack" else thin for sub_id, sink_kind in sinks}
            staged += store_events(system_team().id, event_type, data, bodies)
    if kind in TEAM_EVENTS and team_id is not None:
        # Not to the subscription it is about: it is the one failing.
        wanting = [sub_id for sub_id in subscribers(team_id, event_type) if sub_id != data.get("subscription_id")]
        staged += store_events(team_id, event_type, data, {sub_id: thin for sub_id in wanting})
    return staged


def sinks_hearing(kind: str, team_id: int | None, not_to: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """(subscription id, sink kind) of every sink whose filter takes this notification, but those in `not_to`."""
    return [(sub_id, sink_kind) for sub_id, sink_kind, teams, kinds in db.session.execute(
            select(NotificationSink.subscription_id, NotificationSink.kind, NotificationSink.team_ids,
                   NotificationSink.kinds)).all() if hears(teams, kinds, kind, team_id) and sub_id not in not_to]


def hears(team_ids, kinds, kind: str, team_id: int | None) -> bool:
    """Does a sink with this filter hear a notification of this kind about this team (None: Promesa's own,
    or several teams)? An empty filter hears everything."""
    return (not kinds or kind in kinds) and (not team_ids or team_id in team_ids)


def asks_for(patterns, event_type: str) -> bool:
    """Does a subscription name this operational type? Only patterns that say `promesa.` count."""
    return any(p.startswith("promesa.") and fnmatch.fnmatchcase(event_type, p) for p in patterns or ())


def subscribers(team_id: int, event_type: str) -> list[str]:
    """The team's own subscriptions that ask for this operational type: never a consumer's, which would hear of
    the team's other consumers."""
    rows = db.session.execute(select(Subscription.id, Subscription.event_types)
                              .where(Subscription.team_id == team_id, Subscription.consumer_id.is_(None))).all()
    return [sub_id for sub_id, patterns in rows if asks_for(patterns, event_type)]


# -- what is announced ------------------------------------------------------------------------
# Per sweep and change, this many incidents are told one by one; the rest as one message per team.
GROUP_AFTER = 3


def sink_label(sink: NotificationSink) -> str:
    """How a sink is named in every notification, event and message: its URL is a credential (a Slack webhook)."""
    return f"{sink.name} ({sink.kind} sink #{sink.id})" if sink.name else f"{sink.kind} sink #{sink.id}"


def _sinks_by_subscription() -> dict[str, NotificationSink]:
    return {sink.subscription_id: sink for sink in db.session.scalars(select(NotificationSink))}


def consumer_uid(sub: Subscription | None) -> str | None:
    """The uid of the consumer whose endpoint this is; None for a team's own endpoint (or none at all)."""
    return sub.consumer.uid if sub is not None and sub.consumer_id is not None else None


def _named(sub: Subscription, sinks: dict[str, NotificationSink]) -> str:
    """A subscription as notifications name it: a sink (or a removed one) by its label, never its URL; a
    consumer's endpoint with its consumer."""
    if sub.id in sinks:
        return sink_label(sinks[sub.id])
    if sub.team_id == access.system_team_id():
        return f"removed notification sink (subscription {sub.id})"
    uid = consumer_uid(sub)
    return f"{sub.url} (consumer {uid})" if uid else sub.url


def _not_to(subscription_ids, sinks: dict[str, NotificationSink]) -> frozenset[str]:
    """The sinks among these subscriptions: a failing sink is not told about itself (it would fail again)."""
    return frozenset(sub_id for sub_id in subscription_ids if sub_id in sinks)


def _snoozed(incident) -> bool:
    return incident.snoozed_until is not None and incident.snoozed_until > current_app.config["CLOCK"].now()


def incident_changed(incident, change: str, to_sinks: bool = True) -> int:
    """Opened, acknowledged or resolved: to the sinks (but the one it is about), and (opened, resolved) to the
    team; nothing while snoozed. Returns how many sinks will be told."""
    if _snoozed(incident):
        return 0
    from_rules = incident.rules or {incident.rule: {}}
    sinks = _sinks_by_subscription()
    sub = db.session.get(Subscription, incident.subscription_id) if incident.subscription_id else None
    where = f" on {_named(sub, sinks)}" if sub is not None else " in Promesa"
    setting = setting_of(incident) if sub is not None or incident.rule == "backlog" else None
    why = f" ({setting.describe()})" if setting is not None else ""
    who = f" by {incident.acknowledged_by}" if change == "acknowledged" else \
        (f" by {incident.resolved_by}" if change == "resolved" and incident.resolved_by else "")
    if change == "acknowledged" and incident.acknowledged_note:
        who += f" ({incident.acknowledged_note})"
    text = f"Incident {change}{who}: {title(incident.rule)}{where}{why}."
    if change == "opened":
        text += " " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in incident.figures.items()
                                if k not in ("threshold", "window_minutes", "min_attempts"))
        if len(from_rules) > 1:
            text += ". Also fired: " + ", ".join(title(r) for r in from_rules if r != incident.rule) + "."
    data = {"incident_id": incident.id, "rule": incident.rule, "rules": list(from_rules), "state": incident.state,
            "subscription_id": incident.subscription_id, "consumer": consumer_uid(sub),
            "opened_at": iso(incident.opened_at)}
    not_to = _not_to([incident.subscription_id], sinks)
    notify(f"incident.{change}", text=text, path=f"/incidents/{incident.id}", data=data,
           team_id=incident.team_id, to_sinks=to_sinks, not_to=not_to)
    return len(sinks_hearing(f"incident.{change}", incident.team_id, not_to)) if to_sinks else 0


def incidents_changed(changes: list[tuple]) -> None:
    """A sweep's incidents opened and resolved: the first GROUP_AFTER of each change one by one, the rest to the
    sinks as one message per team ("12 more incidents opened in team alpha", linking to that list). Teams' own
    subscriptions still get one event per incident: they asked for each. Snoozed ones are told to nobody."""
    sinks = _sinks_by_subscription()
    for change in ("opened", "acknowledged", "resolved"):
        incidents = [incident for incident, what in changes if what == change and not _snoozed(incident)]
        for n, incident in enumerate(incidents):
            incident_changed(incident, change, to_sinks=n < GROUP_AFTER)
        by_team: dict[int | None, list] = {}
        for incident in incidents[GROUP_AFTER:]:
            by_team.setdefault(incident.team_id, []).append(incident)
        names = dict(db.session.execute(select(Team.id, Team.name).where(
            Team.id.in_([t for t in by_team if t is not None]))).all())
        for team_id, group in by_team.items():
            name = names.get(team_id)
            state = IncidentState.RESOLVED if change == "resolved" else IncidentState.OPEN
            path = f"/incidents?{urlencode({'team': name, 'state': state} if name else {'state': state})}"
            more = "more incident" + ("s" if len(group) > 1 else "")
            text = f"{len(group)} {more} {change} in " + (f"team {name}." if name else "Promesa itself.")
            notify(f"incident.{change}", text=text, path=path,
                   data={"incident_ids": [i.id for i in group], "count": len(group), "team": name},
                   not_to=_not_to([i.subscription_id for i in group], sinks))


def subscription_disabled(sub: Subscription, reason: str) -> int:
    sinks = _sinks_by_subscription()
    return notify("subscription.disabled", text=f"Subscription {_named(sub, sinks)} disabled: {reason}",
                  path=f"/subscriptions/{sub.id}", data={"subscription_id": sub.id, "consumer": consumer_uid(sub)},
                  team_id=sub.team_id,
                  not_to=_not_to([sub.id], sinks))


def replay_finished(*, subscription_id: str | None, team_id: int | None, replayed: int, delivered: int | None = None,
                    held: int = 0, sent: int | None = None, path: str | None = None,
                    replay_id: str | None = None) -> int:
    """For dashboard.operations.replays.on_finished: a replay's job has re-queued all of it, to the sinks.
    "Finished" only with `delivered` given for all of it; held deliveries are told apart from sent ones."""
    uid = consumer_uid(db.session.get(Subscription, subscription_id) if subscription_id else None)
    data = {"subscription_id": subscription_id, "consumer": uid, "replayed": replayed, "held": held}
    if sent is not None:
        data["sent"] = sent
    if replay_id:
        data["replay_id"] = replay_id
    what = f"Replay to consumer {uid}" if uid else "Replay"
    if held:
        text = (f"{what} of {replayed} deliveries re-queued: {held} held until the subscription resumes, "
                f"{sent or 0} sent so far.")
    elif delivered is not None and delivered >= replayed:
        text = f"{what} of {replayed} deliveries finished, {delivered} delivered."
    else:
        text = f"{what} of {replayed} deliveries re-queued: on their way{f', {sent} sent so far' if sent else ''}."
    return notify("replay.finished", text=text, path=path or f"/subscriptions/{subscription_id}", data=data,
                  team_id=team_id)


def publish_dead_letters(now: dt.datetime) -> int:
    """`promesa.delivery.dead` for the deliveries dead-lettered since the last pass, to the teams that
    ask for it. Read here, by the sweeper, never on the engine's hot path: outcome_counts says which
    subscriptions had any; their dead deliveries are read through the (subscription, state) index."""
    upto = now - DEAD_LETTER_LAG
    found = folding.mark("dead_letters", at=upto - FIRST_LOOK_BACK)
    since = found.at
    if since >= upto or not folding.move_mark(found, at=upto):
        db.session.commit()
        return 0
    subs = db.session.execute(select(Subscription.id, Subscription.team_id, Subscription.event_types,
                                     Subscription.consumer_id)).all()
    wanting_teams = {team_id for _, team_id, patterns, consumer_id in subs
                     if consumer_id is None and asks_for(patterns, "promesa.delivery.dead")}
    candidates = [sub_id for sub_id, team_id, _, _ in subs if team_id in wanting_teams]
    with_dead = []
    for ids in folding.chunks(candidates):
        with_dead += db.session.scalars(select(OutcomeCount.subscription_id).distinct().where(
            OutcomeCount.subscription_id.in_(ids), OutcomeCount.dead > 0,
            OutcomeCount.minute >= since.replace(second=0, microsecond=0) - dt.timedelta(minutes=5))).all()
    staged = 0
    if with_dead:
        rows = db.session.execute(
            select(Delivery.id, Delivery.subscription_id, Event.id, Delivery.attempt_count,
                   Delivery.last_status_code, Delivery.dead_lettered_at, Event.type, Subscription.team_id, Consumer.uid)
            .join(Event, Event.key == Delivery.event_key)
            .join(Subscription, Subscription.id == Delivery.subscription_id)
            .outerjoin(Consumer, Consumer.id == Subscription.consumer_id)
            .where(Delivery.subscription_id.in_(with_dead), Delivery.state == DeliveryState.DEAD,
                   Delivery.dead_lettered_at >= since, Delivery.dead_lettered_at < upto)
            .order_by(Delivery.dead_lettered_at).limit(MAX_DEAD_LETTER_EVENTS)).all()
        if len(rows) == MAX_DEAD_LETTER_EVENTS:  # the rest on the next pass: the mark stops at the last one told
            db.session.execute(update(SweepMark).where(SweepMark.name == found.name).values(at=rows[-1].dead_lettered_at))
        for delivery_id, sub_id, event_id, attempts, status, dead_at, event_type, team_id, uid in rows:
            if event_type.startswith("promesa."):
                continue  # an operational event's own dead letter announces nothing: no chains
            to_whom = f" (consumer {uid})" if uid else ""
            staged += notify("delivery.dead", text=f"Delivery {delivery_id}{to_whom} dead-lettered",
                             path=f"/deliveries/{delivery_id}", team_id=team_id,
                             data={"delivery_id": delivery_id, "subscription_id": sub_id, "consumer": uid,
                                   "event_id": event_id,
                                   "event_type": event_type, "attempts": attempts, "last_status_code": status,
                                   "dead_lettered_at": iso(dead_at)})
    db.session.commit()
    return staged


# -- sinks --------------------------------------------------------------------------------------
def masked(url: str) -> str:
    """A sink's address without its secret part (a Slack webhook URL is a credential)."""
    parts = urlsplit(url)
    first = parts.path.strip("/").split("/")[0]
    return f"{parts.scheme}://{parts.netloc}/{first + '/…' if first else ''}"


def system_team() -> Team:
    return accounts.team_named(SYSTEM_TEAM)  # created the first time a sink needs it


SINK_NAME_MAX = 100


def sink_filter(team_names: list[str] | None, kinds: list[str] | None) -> tuple[list[int], list[str]]:
    """A sink's filter from team names and notification kinds, checked: ([team ids], [kinds]); empty: all."""
    kinds = sorted(set(kinds or ()))
    unknown = [k for k in kinds if k not in SINK_NOTIFICATIONS]
    if unknown:
        raise ApiError(400, f"notification kinds are: {', '.join(sorted(SINK_NOTIFICATIONS))} (not {', '.join(unknown)})")
    names = sorted({n.strip() for n in team_names or () if n.strip()})
    teams = dict(db.session.execute(select(Team.name, Team.id).where(Team.name.in_(names),
                                                                     Team.name != SYSTEM_TEAM)).all())
    missing = [n for n in names if n not in teams]
    if missing:
        raise ApiError(400, f"no team named {', '.join(missing)}")
    return sorted(teams.values()), kinds


def sink_name(name: str | None) -> str:
    """A sink's name, checked: what people call it, on one line."""
    name = (name or "").strip()
    if len(name) > SINK_NAME_MAX or any(ord(ch) < 0x20 for ch in name):
        raise ApiError(400, f"a sink's name is at most {SINK_NAME_MAX} characters, on one line")
    return name


def add_sink(kind: str, url: str, actor: tuple[str, str] | None = None, *, name: str = "",
             teams: list[str] | None = None, kinds: list[str] | None = None) -> tuple[NotificationSink, str]:
    """A new sink and its signing secret (shown once: JSON sinks verify signatures with it). `teams`, `kinds`:
    what it hears (None or empty: everything)."""
    if kind not in SINK_KINDS:
        raise ApiError(400, f"kind must be one of: {', '.join(SINK_KINDS)}")
    if not isinstance(url, str) or not url.strip():
        raise ApiError(400, "url is required")
    name = sink_name(name)
    team_ids, kinds = sink_filter(teams, kinds)
    url = url.strip()
    problem = url_problem(url, current_app.config["PROMESA_ALLOW_PRIVATE_TARGETS"])
    if problem:
        raise ApiError(422, problem)
    now = current_app.config["CLOCK"].now()
    secret = signing.new_secret()
    sub = Subscription(team_id=system_team().id, url=url, description=f"{kind} notification sink {name}".strip(),
                       event_types=["promesa.notification"], event_versions={}, retry_policy="exponential",
                       signature_scheme="promesa", state=SubscriptionState.ACTIVE,
                       secret_ciphertext=crypto.encrypt(secret), created_at=now, updated_at=now)
    db.session.add(sub)
    db.session.flush()
    actor = actor or audit.current_actor()
    sink = NotificationSink(kind=kind, name=name, team_ids=team_ids or None, kinds=kinds or None,
                            subscription_id=sub.id, created_at=now, created_by=actor[1])
    db.session.add(sink)
    db.session.flush()
    audit.record("sink.added", subscription=sub, target=f"sink:{sink.id}", actor=actor,
                 detail={"kind": kind, "name": name, "url": masked(url), "teams": teams_named(team_ids),
                         "kinds": kinds})
    db.session.commit()
    return sink, secret


def change_sink(sink: NotificationSink, actor: tuple[str, str] | None = None, *, name: str,
                teams: list[str] | None, kinds: list[str] | None) -> list[str]:
    """A sink's new name and filter (`teams`, `kinds` empty: everything), audited with each changed field's old
    and new value. Its address stays: a new URL is a new sink, with a new secret. Returns the fields changed."""
    team_ids, kinds = sink_filter(teams, kinds)
    before = {"name": sink.name or "", "teams": teams_named(sink.team_ids), "kinds": sink.kinds or []}
    after = {"name": sink_name(name), "teams": teams_named(team_ids), "kinds": kinds}
    changed = [field for field in after if before[field] != after[field]]
    if not changed:
        return []
    sink.name, sink.team_ids, sink.kinds = after["name"], team_ids or None, kinds or None
    sink.subscription.description = f"{sink.kind} notification sink {after['name']}".strip()
    sink.subscription.updated_at = current_app.config["CLOCK"].now()
    audit.record("sink.changed", subscription=sink.subscription, target=f"sink:{sink.id}",
                 actor=actor or audit.current_actor(),
                 detail={"before": {f: before[f] for f in changed}, "after": {f: after[f] for f in changed}})
    db.session.commit()
    return changed


def teams_named(team_ids: list[int] | None) -> list[str]:
    if not team_ids:
        return []
    return sorted(db.session.scalars(select(Team.name).where(Team.id.in_(team_ids))).all())


def describe_filter(sink: NotificationSink) -> str:
    """What a sink hears, in words."""
    teams = teams_named(sink.team_ids)
    kinds = sink.kinds or []
    return (f"{', '.join(kinds) if kinds else 'every kind'} · "
            f"{'teams ' + ', '.join(teams) if teams else 'every team, and Promesa itself'}")


SINK_TEST = "sink.test"


def send_test(sink: NotificationSink, actor: tuple[str, str] | None = None) -> str:
    """A test message to this one sink, whatever its filter says, through the same deliveries as the real ones.
    Returns the delivery's id (its page says how the sink answered)."""
    now = current_app.config["CLOCK"].now()
    data = {"sink_id": sink.id, "test": True, "url": absolute("/sinks")}
    if sink.kind == "slack":
        message = json.dumps({"text": f"Test message from Promesa to the sink {slack_escape(sink.name or sink.id)}: "
                                      f"notifications will arrive here. <{absolute('/sinks')}|Open in Promesa>"})
        body = lambda _event_id: message  # noqa: E731 - Slack reads its own shape
    else:
        body = _thin(f"promesa.{SINK_TEST}", data)
    store_events(system_team().id, f"promesa.{SINK_TEST}", data, {sink.subscription_id: body})
    audit.record("sink.tested", subscription=sink.subscription, target=f"sink:{sink.id}",
                 actor=actor or audit.current_actor(), detail={"name": sink.name})
    db.session.flush()
    delivery_id = db.session.scalar(select(Delivery.id).join(Event, Event.key == Delivery.event_key).where(
        Delivery.subscription_id == sink.subscription_id, Event.type == f"promesa.{SINK_TEST}",
        Delivery.created_at == now).order_by(Delivery.id.desc()).limit(1))
    db.session.commit()
    return delivery_id


def remove_sink(sink: NotificationSink, actor: tuple[str, str] | None = None) -> None:
    """No more notifications to it; its subscription is disabled (its history stays, like any delivery's)."""
    sub = sink.subscription
    hold(sub, SubscriptionState.DISABLED, "notification sink removed", "sink.removed", target=f"sink:{sink.id}",
         actor=actor, detail={"kind": sink.kind, "url": masked(sub.url)})
    db.session.delete(sink)
    db.session.commit()


def sinks() -> list[NotificationSink]:
    return db.session.scalars(select(NotificationSink).order_by(NotificationSink.created_at)).all()
