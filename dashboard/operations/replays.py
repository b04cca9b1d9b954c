"""Dead letters across subscriptions, and bulk replay (or discard) as a job with progress.

A replay is a row (`models.Replay`): who asked, the filter, how many matched, how far it got.
`start()` stores it and, after the commit, enqueues `run(replay_id)` on the repairs lane
(dashboard.queue.lanes), never on the delivery workers' queue; the job re-queues the matching dead
letters in chunks with `subscriptions.restart` (the same code as a one-subscription replay),
stamping each with the replay's id so its outcomes can be counted live.
A second `start()` with the same filter while one is queued or running returns that one.
A discard is the same job (a row of kind "discard"): its chunks end the dead letters `discarded`.
A recover ("replay since", kind "recover") too: its chunks are a consumer's events (dashboard.operations.recover).
One job of a team runs at a time: another of the team stays queued, and the one that ends starts it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import re

import redis
from flask import current_app
from sqlalchemy import func, literal_column, or_, select, tuple_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import aliased, joinedload, selectinload

from dashboard import audit
from dashboard.consumers import service as consumer_service
from dashboard.core.clock import iso
from dashboard.core.extensions import db
from dashboard.core.validation import TYPE_PATTERN, ApiError, parse_id, parse_time
from dashboard.models import (
    CONSUMER_UID_PATTERN,
    AuditEntry,
    Consumer,
    Delivery,
    DeliveryState,
    Event,
    Replay,
    ReplayKind,
    ReplayState,
    Subscription,
)
from dashboard.operations import notifications, recover
from dashboard.queue import lanes
from dashboard.schemas import CONSUMER_UID_WORDS, MAX_SELECTED_DEAD_LETTERS
from dashboard.subscriptions import service as subscription_service

log = logging.getLogger(__name__)

_TYPE_NAME = re.compile(TYPE_PATTERN)
_CONSUMER_UID = re.compile(CONSUMER_UID_PATTERN)
_STATUS_CODE = re.compile(r"^[1-5]\d\d$")
_STATUS_CLASS = re.compile(r"^([1-5])xx$")
MAX_SELECTED = MAX_SELECTED_DEAD_LETTERS
# RQ ends a replay's job after this; a job running longer (its worker lost) no longer holds up its team's next.
JOB_TIMEOUT_SECONDS = 6 * 3600


@dataclasses.dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters: every field narrows; an empty filter means all of them."""

    subscription_id: str | None = None
    team_id: int | None = None
    event_types: tuple[str, ...] = ()
    since: dt.datetime | None = None  # dead-lettered at or after
    until: dt.datetime | None = None  # dead-lettered before
    result: str | None = None  # last status code ("503"), a class ("5xx") or an error's start ("timeout")
    delivery_ids: tuple[str, ...] = ()  # "replay selected"
    hidden_team_id: int | None = None  # never this team's (operators never reach the system team's sinks)
    consumer: str | None = None  # the uid of one of team_id's consumers: its subscriptions' dead letters

    def __post_init__(self):
        if self.consumer is not None:
            if not isinstance(self.consumer, str) or not _CONSUMER_UID.match(self.consumer):
                raise ApiError(400, f"consumer must be {CONSUMER_UID_WORDS}")
            if self.team_id is None:
                raise ApiError(400, "choose the team of consumer " + repr(self.consumer))
        if self.since and self.until and self.since >= self.until:  # well-formed, but an empty window
            raise ApiError(422, "since must be before until")
        for t in self.event_types:
            if not isinstance(t, str) or not _TYPE_NAME.match(t):
                raise ApiError(400, f"event_types must be event type names, not {t!r}")
        if self.result is not None and (not isinstance(self.result, str) or not 0 < len(self.result) <= 200):
            raise ApiError(400, "result must be a status code (503), a class (5xx) or the start of an error")
        if len(self.delivery_ids) > MAX_SELECTED:
            raise ApiError(400, f"select at most {MAX_SELECTED} deliveries at a time")

    @classmethod
    def from_args(cls, args) -> DeadLetterFilter:
        """From the dashboard's query string or form (empty fields mean "any")."""
        team = parse_id(args.get("team"), "team")
        event_type = (args.get("event_type") or "").strip()
        return cls(subscription_id=(args.get("subscription") or "").strip() or None,
                   team_id=team,
                   event_types=(event_type,) if event_type else (),
                   since=parse_time(args.get("since"), "since"), until=parse_time(args.get("until"), "until"),
                   result=(args.get("result") or "").strip() or None,
                   consumer=(args.get("consumer") or "").strip() or None)

    @classmethod
    def from_json(cls, data: dict) -> DeadLetterFilter:
        return cls(subscription_id=data.get("subscription_id"), team_id=data.get("team_id"),
                   event_types=tuple(data.get("event_types", ())),
                   since=parse_time(data.get("since"), "since"), until=parse_time(data.get("until"), "until"),
                   result=data.get("result"), delivery_ids=tuple(data.get("delivery_ids", ())),
                   hidden_team_id=data.get("hidden_team_id"), consumer=data.get("consumer"))

    def as_json(self) -> dict:
        out = {"subscription_id": self.subscription_id, "team_id": self.team_id,
               "event_types": list(self.event_types) or None, "since": iso(self.since), "until": iso(self.until),
               "result": self.result, "delivery_ids": sorted(self.delivery_ids) or None,
               "hidden_team_id": self.hidden_team_id, "consumer": self.consumer}
        return {k: v for k, v in out.items() if v is not None}

    def as_args(self) -> dict:
        """The query string that shows this filter on the dead-letters page."""
        fmt = "%Y-%m-%dT%H:%M"
        out = {"subscription": self.subscription_id, "team": self.team_id,
               "event_type": self.event_types[0] if self.event_types else None,
               "since": self.since.strftime(fmt) if self.since else None,
               "until": self.until.strftime(fmt) if self.until else None, "result": self.result,
               "consumer": self.consumer}
        return {k: v for k, v in out.items() if v is not None}

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.as_json(), sort_keys=True).encode()).hexdigest()

    def where(self, visible_teams=None) -> list:
        """WHERE clauses for the dead deliveries this filter means; `visible_teams` is a clause on
        Subscription.team_id limiting which teams' subscriptions count (None: every team)."""
        clauses = [Delivery.state == DeliveryState.DEAD]
        if self.subscription_id:
            clauses.append(Delivery.subscription_id == self.subscription_id)
        team_clauses = [c for c in (visible_teams,) if c is not None]
        if self.team_id is not None:
            team_clauses.append(Subscription.team_id == self.team_id)
        if self.hidden_team_id is not None:
            team_clauses.append(Subscription.team_id != self.hidden_team_id)
        if self.consumer is not None:
            team_clauses.append(Subscription.consumer_id.in_(consumer_service.ids_named(self.team_id, self.consumer)))
        if team_clauses:
            clauses.append(Delivery.subscription_id.in_(select(Subscription.id).where(*team_clauses)))
        if self.event_types:
            clauses.append(Delivery.event.has(Event.type.in_(self.event_types)))
        if self.since:
            clauses.append(Delivery.dead_lettered_at >= self.since)
        if self.until:
            clauses.append(Delivery.dead_lettered_at < self.until)
        if self.result:
            clauses.append(_result_clause(self.result))
        if self.delivery_ids:
            clauses.append(Delivery.id.in_(self.delivery_ids))
        return clauses


def _result_clause(result: str):
    if _STATUS_CODE.match(result):
        return Delivery.last_status_code == int(result)
    if match := _STATUS_CLASS.match(result):
        low = int(match.group(1)) * 100
        return Delivery.last_status_code.between(low, low + 99)
    escaped = result.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return Delivery.last_error.like(escaped + "%", escape="\\")


# -- the dead-letters page ---------------------------------------------------------------------
def count(where: list) -> int:
    return db.session.scalar(select(func.count()).select_from(Delivery).where(*where))


def page(where: list, before: str | None, limit: int) -> tuple[list[Delivery], str | None]:
    """Newest dead letters first, `limit` at a time; `before` is the previous page's cursor."""
    query = select(Delivery).where(*where).options(
        joinedload(Delivery.event).load_only(Event.type), selectinload(Delivery.subscription))
    if before:
        at, _, delivery_id = before.partition("|")
        try:
            at = dt.datetime.fromisoformat(at)
        except ValueError:
            raise ApiError(400, "before must be a cursor from the previous page") from None
        query = query.where(tuple_(Delivery.dead_lettered_at, Delivery.id) < tuple_(at, delivery_id))
    rows = db.session.scalars(query.order_by(Delivery.dead_lettered_at.desc(), Delivery.id.desc())
                              .limit(limit + 1)).all()
    shown = rows[:limit]
    cursor = f"{shown[-1].dead_lettered_at.isoformat()}|{shown[-1].id}" if len(rows) > limit else None
    return shown, cursor


# -- starting, running, cancelling -----------------------------------------------------------------
def active_with(key: str) -> Replay | None:
    return db.session.scalar(select(Replay).where(Replay.filter_key == key, Replay.state.in_(ReplayState.ACTIVE)))


def job_key(dead: DeadLetterFilter, kind: str) -> str:
    """A job's filter key: a replay's is the filter's own (as stored before discards existed)."""
    if kind == ReplayKind.REPLAY:
        return dead.key()
    return hashlib.sha256(f"{kind}:{dead.key()}".encode()).hexdigest()


def start(dead: DeadLetterFilter, kind: str = ReplayKind.REPLAY) -> tuple[Replay, bool]:
    """Store a replay (or a discard) of the dead letters matching `dead` and enqueue its job; (replay, started).
    If one of the same kind and filter is queued or running, that one is returned (started False).
    The caller has already narrowed `dead` to what the actor may operate."""
    sub = db.session.get(Subscription, dead.subscription_id) if dead.subscription_id else None
    if sub is not None and (dead.team_id is not None and sub.team_id != dead.team_id
                            or dead.hidden_team_id is not None and sub.team_id == dead.hidden_team_id):
        raise ApiError(404, "no such subscription")  # outside what the actor may operate: it does not exist
    if sub is not None and dead.team_id is None:  # one spelling per filter, so a second click finds the first
        dead = dataclasses.replace(dead, team_id=sub.team_id)
    return _store(kind, dead.as_json(), job_key(dead, kind), team_id=sub.team_id if sub is not None else dead.team_id,
                  subscription_id=sub.id if sub is not None else None,
                  total=lambda now: count(dead.where() + [Delivery.dead_lettered_at <= now]))


def start_recover(consumer: Consumer, subscription: Subscription, since: dt.datetime) -> tuple[Replay, bool]:
    """"Replay since" (a recover): every event addressed to `consumer` accepted at or after `since` (naive UTC),
    to `subscription`, one of its endpoints, as a job with progress; (replay, started). An event with no
    delivery to it gets one, a dead one is sent again, one delivered or on its way is left alone; only the event
    types the subscription takes. A second start for the same consumer, subscription and time while one is queued
    or running returns that one (started False). The caller has checked the actor may operate the consumer."""
    if subscription.consumer_id != consumer.id or consumer.deleted_at is not None:
        raise ApiError(422, f"subscription {subscription.id} is not an endpoint of consumer {consumer.uid!r}")
    subscription_service.not_deleted(subscription)
    wanted = recover.RecoverFilter(consumer_id=consumer.id, consumer=consumer.uid, subscription_id=subscription.id,
                            team_id=consumer.team_id, since=since)
    return _store(ReplayKind.RECOVER, wanted.as_json(), wanted.key(), team_id=consumer.team_id,
                  subscription_id=subscription.id, total=lambda now: wanted.count(subscription, now))


def _store(kind: str, filter_json: dict, key: str, *, team_id: int | None, subscription_id: str | None,
           total) -> tuple[Replay, bool]:
    """The row of a bulk job, its audit entry, and after the commit its job: or the active one with this key.
    `total(now)`: how much it matches when asked for."""
    running = active_with(key)
    if running is not None:
        return running, False
    now = current_app.config["CLOCK"].now()
    matched = total(now)
    actor_kind, name = audit.current_actor()
    replay = Replay(kind=kind, actor_kind=actor_kind, actor=name, filter=filter_json, filter_key=key, total=matched,
                    done=0, succeeded=0, failed=0, created_at=now, team_id=team_id, subscription_id=subscription_id,
                    state=ReplayState.QUEUED if matched else ReplayState.FINISHED,
                    finished_at=None if matched else now)
    db.session.add(replay)
    try:
        db.session.flush()
    except IntegrityError:  # the same filter was started by a concurrent click: show that one
        db.session.rollback()
        return active_with(key), False
    _record(replay, f"{replay.kind}.started", deliveries=matched, detail=replay.filter)
    if not matched:
        on_finished(replay)
    db.session.commit()
    if matched:  # after the commit: the job must find its row
        try:
            _enqueue(replay.id)
        except (redis.RedisError, OSError) as exc:  # say so on the replay's page; never leave it queued forever
            log.warning("could not enqueue replay %s", replay.id, exc_info=True)
            _end(replay.id, ReplayState.FAILED, error=f"could not reach the workers' queue: {exc}"[:500])
    return replay, True


def _enqueue(replay_id: str) -> None:
    lanes.enqueue("repairs", "dashboard.jobs.replay", replay_id, job_id=f"replay-{replay_id}",
                  job_timeout=JOB_TIMEOUT_SECONDS, result_ttl=86400, failure_ttl=7 * 86400)


def _claim(replay_id: str, now: dt.datetime) -> bool:
    """Queued to running, unless another job of its team is running (and not lost): one per team at a time."""
    team_id = db.session.scalar(select(Replay.team_id).where(Replay.id == replay_id))
    of_team = Replay.team_id.is_not_distinct_from(team_id)
    # Two workers claiming jobs of one team wait for each other here (PostgreSQL): the second sees the first run.
    db.session.execute(select(Replay.id).where(of_team, Replay.state.in_(ReplayState.ACTIVE)).with_for_update())
    other = aliased(Replay)
    busy = select(other.id).where(other.team_id.is_not_distinct_from(team_id), other.id != replay_id,
                                  other.state == ReplayState.RUNNING,
                                  other.started_at > now - dt.timedelta(seconds=JOB_TIMEOUT_SECONDS)).exists()
    claimed = db.session.execute(
        update(Replay).where(Replay.id == replay_id, Replay.state == ReplayState.QUEUED, ~busy)
        .values(state=ReplayState.RUNNING, started_at=now)).rowcount
    db.session.commit()
    return bool(claimed)


def _start_next(team_id: int | None) -> None:
    """A job of this team ended: start its oldest queued one (which waited for it), if any."""
    waiting = db.session.scalar(select(Replay.id).where(Replay.team_id.is_not_distinct_from(team_id),
                                                        Replay.state == ReplayState.QUEUED)
                                .order_by(Replay.created_at, Replay.id).limit(1))
    if waiting is None:
        return
    try:
        _enqueue(waiting)
    except (redis.RedisError, OSError):  # it stays queued; the team's next job to end starts it
        log.warning("could not enqueue replay %s", waiting, exc_info=True)


def run(replay_id: str) -> dict:
    """The RQ job: re-queue the replay's dead letters chunk by chunk, moving `done` after each, until
    none is left or someone cancels it. Failures mark the row failed, then propagate to RQ."""
    clock = current_app.config["CLOCK"]
    chunk = current_app.config["PROMESA_REPLAY_CHUNK"]
    try:
        if not _claim(replay_id, clock.now()):  # cancelled before it started, another worker has it, or it
            return {"replay": replay_id, "ran": False}  # waits for its team's running one, which starts it
        replay = db.session.get(Replay, replay_id)
        chunks = recover.chunks(replay, chunk) if replay.kind == ReplayKind.RECOVER else _dead_chunks(replay, chunk)
        for _, moved in chunks:
            progressed = db.session.execute(
                update(Replay).where(Replay.id == replay_id, Replay.state == ReplayState.RUNNING)
                .values(done=Replay.done + moved)).rowcount
            if not progressed:  # cancelled meanwhile: this chunk stays as it was
                db.session.rollback()
                return {"replay": replay_id, "ran": True, "cancelled": True}
            db.session.commit()  # and the chunk's deliveries go to the workers (subscriptions.restart)
            if lanes.stopping.is_set():  # its worker stops: queued again, the next worker goes on from here
                return {"replay": replay_id, "ran": True, "requeued": _requeue(replay_id)}
        return {"replay": replay_id, "ran": True, "state": _end(replay_id, ReplayState.FINISHED)}
    except Exception as exc:
        db.session.rollback()
        _end(replay_id, ReplayState.FAILED, error=f"{type(exc).__name__}: {exc}"[:500])
        raise
    finally:
        db.session.remove()


def _dead_chunks(replay: Replay, chunk: int):
    """A replay's or a discard's chunks of dead letters: (restarted, how many moved), each left uncommitted."""
    # Only what was dead when it was asked for, and never the same delivery twice.
    where = DeadLetterFilter.from_json(replay.filter).where() + [
        Delivery.dead_lettered_at <= replay.created_at,
        or_(Delivery.replay_id.is_(None), Delivery.replay_id != replay.id)]
    while ids := db.session.scalars(select(Delivery.id).where(*where)
                                    .order_by(Delivery.dead_lettered_at, Delivery.id).limit(chunk)).all():
        if replay.kind == ReplayKind.DISCARD:
            yield [], discard_dead(Delivery.id.in_(ids), job_id=replay.id)
        else:
            restarted = subscription_service.restart(
                Delivery.id.in_(ids), Delivery.state == DeliveryState.DEAD, replay_id=replay.id)
            yield restarted, len(restarted)


def _requeue(replay_id: str) -> bool:
    """Running back to queued, and its job enqueued again (what it did stays done: it skips its own)."""
    requeued = db.session.execute(update(Replay).where(Replay.id == replay_id, Replay.state == ReplayState.RUNNING)
                                  .values(state=ReplayState.QUEUED)).rowcount
    db.session.commit()
    if requeued:
        _enqueue(replay_id)
    return bool(requeued)


def _end(replay_id: str, state: str, error: str | None = None) -> str | None:
    """Move a queued or running replay to its end state, once, tell on_finished, and start the team's next."""
    outcome = outcomes(replay_id)
    ended = db.session.execute(
        update(Replay).where(Replay.id == replay_id, Replay.state.in_(ReplayState.ACTIVE))
        .values(state=state, finished_at=current_app.config["CLOCK"].now(), error=error,
                succeeded=outcome["succeeded"], failed=outcome["failed"])).rowcount
    team_id = None
    if ended:
        replay = db.session.get(Replay, replay_id)
        db.session.refresh(replay)
        on_finished(replay)
        team_id = replay.team_id
    db.session.commit()
    if ended:
        _start_next(team_id)
    return state if ended else None


def cancel(replay: Replay) -> bool:
    """Stop a queued or running replay: the chunk in progress, if any, is not re-queued."""
    if replay.state not in ReplayState.ACTIVE:
        return False
    return _end(replay.id, ReplayState.CANCELLED) is not None


def discard_dead(*where, job_id: str | None = None) -> int:
    """End the dead letters matching `where` discarded: never sent again, still readable (they keep
    dead_lettered_at, for retention). Returns how many; the caller commits."""
    return db.session.execute(
        update(Delivery).where(*where, Delivery.state == DeliveryState.DEAD)
        .values(state=DeliveryState.DISCARDED, next_attempt_at=None, replay_id=job_id,
                updated_at=current_app.config["CLOCK"].now())
        .execution_options(synchronize_session=False)).rowcount


def on_finished(replay: Replay) -> None:
    """Called once when a replay's job ends (finished, cancelled or failed), in the transaction that ends it:
    the audit entry, and for a finished one the notification to the sinks (staged with this commit).
    A finished replay's entry waits for its deliveries' outcomes (`record_outcomes`): re-queued is not delivered."""
    live = outcomes(replay.id)
    if replay.kind == ReplayKind.DISCARD:
        _record(replay, f"discard.{replay.state}", deliveries=replay.done,
                detail={"total": replay.total, "discarded": live["discarded"],
                        **({"error": replay.error} if replay.error else {})})
    elif replay.state != ReplayState.FINISHED:
        _record(replay, f"replay.{replay.state}", deliveries=replay.done,
                detail={"total": replay.total, "requeued": replay.done, **({"error": replay.error} if replay.error else {})})
    elif not live["waiting"]:  # nothing on its way (nothing matched, or all of it held): its outcome is known now
        _record_outcome(replay, live)
    if replay.kind in ReplayKind.SENDS and replay.state == ReplayState.FINISHED and replay.done:
        # Re-queued, not yet delivered (held ones not even sent): the replay's page follows the outcomes.
        notifications.replay_finished(subscription_id=replay.subscription_id, team_id=replay.team_id,
                                      replayed=replay.done, held=live["held"], sent=live["sent"],
                                      path=f"/replays/{replay.id}", replay_id=replay.id)


def _record_outcome(replay: Replay, live: dict) -> None:
    """The finished replay's audit entry, with the final counts; its row keeps them too."""
    replay.succeeded, replay.failed = live["succeeded"], live["failed"]
    _record(replay, f"{replay.kind}.finished", deliveries=replay.done,
            detail={"total": replay.total, "requeued": replay.done, "delivered": live["succeeded"],
                    "failed": live["failed"], "held": live["held"], "waiting": live["waiting"]})


def record_outcomes(now: dt.datetime) -> int:
    """A step of the sweeper's minute: each finished replay (or recover) whose re-queued deliveries are no longer
    on their way (delivered, dead again, or held until resume) gets its `replay.finished` (`recover.finished`)
    entry, once (the entry marks it). Returns how many."""
    recorded = literal_column("'replay:'") + Replay.id
    pending = db.session.scalars(
        select(Replay).where(Replay.kind.in_(ReplayKind.SENDS), Replay.state == ReplayState.FINISHED,
                             ~select(AuditEntry.id).where(AuditEntry.action == Replay.kind + ".finished",
                                                          AuditEntry.target == recorded).exists())
        .order_by(Replay.finished_at).with_for_update(skip_locked=True)).all()
    told = 0
    for replay in pending:
        live = outcomes(replay.id)
        if not live["waiting"]:
            _record_outcome(replay, live)
            told += 1
    db.session.commit()
    return told


def _record(replay: Replay, action: str, **kwargs) -> None:
    sub = db.session.get(Subscription, replay.subscription_id) if replay.subscription_id else None
    audit.record(action, subscription=sub, team_id=replay.team_id, target=f"replay:{replay.id}", **kwargs)


# -- progress ----------------------------------------------------------------------------------
def outcomes(replay_id: str) -> dict:
    """The replayed deliveries' fates so far: succeeded, failed (dead again), held (their subscription
    is paused or disabled: nothing is sent until it resumes), still on their way, and discarded (a
    discard's). `sent`: succeeded and failed, what reached the receiver's end."""
    counts = dict(db.session.execute(
        select(Delivery.state, func.count()).where(Delivery.replay_id == replay_id).group_by(Delivery.state)).all())
    succeeded = counts.pop(DeliveryState.SUCCEEDED, 0)
    failed = counts.pop(DeliveryState.DEAD, 0)
    held = counts.pop(DeliveryState.HELD, 0)
    discarded = counts.pop(DeliveryState.DISCARDED, 0)
    return {"succeeded": succeeded, "failed": failed, "held": held, "waiting": sum(counts.values()),
            "sent": succeeded + failed, "discarded": discarded}


def progress_word(replay: Replay, live: dict) -> str:
    """What a replay's state means to the people waiting on it: "finished" only once all of it was sent."""
    if replay.kind in ReplayKind.SENDS and replay.state == ReplayState.FINISHED:
        if live["held"]:
            return "held until resume"
        if live["waiting"]:
            return "sending"
    return replay.state


def recent(visible_teams, limit: int = 50) -> list[Replay]:
    query = select(Replay)
    if visible_teams is not None:
        query = query.where(visible_teams)
    return db.session.scalars(query.order_by(Replay.created_at.desc()).limit(limit)).all()
