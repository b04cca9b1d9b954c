"""The drain loop: take ready delivery ids from Redis, claim them in the database, POST them
with many requests in flight, record every attempt in bulk, and schedule what must be retried.

The database decides who may attempt what: a delivery is claimed by a conditional UPDATE
(due, not leased), so two workers can never both send it, and a stale or duplicated id in
Redis is simply skipped.

Throughput (figures: docs/performance-notes.md): a worker keeps one event loop and
one pooled aiohttp session across drain jobs and lingers briefly for new work; claiming is one
statement on PostgreSQL, and like the attempts (written with COPY on PostgreSQL) it runs in a
thread while requests go on. A subscription with its share of requests in flight keeps a
couple of seconds of work waiting here, and hands the rest back paced at the speed it answers,
so a slow endpoint neither blocks the others nor gets claimed and handed back every second.

Failure has two sizes here (see the README's Reliability section):
- whatever goes wrong with one attempt (the receiver's answer, a header, a bug in reading it) is
  that attempt's recorded error, and the drain goes on: http.post never raises, and the few steps
  around it that could (signing, collecting, deciding) turn an exception into the attempt's error;
- a failure of the drain itself (the database or Redis away, a bug in the loop) is logged loudly;
  before it propagates, the drain gives back the leases of what it claimed but did not send, waits
  for the requests already on the wire and records them (`_Drain.abandon`), so nothing is sent again
  for want of its attempt row, and nothing waits out a lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import json
import logging
import random
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import NamedTuple

import aiohttp
import redis
from sqlalchemy import (
    ARRAY,
    String,
    and_,
    any_,
    bindparam,
    case,
    cast,
    or_,
    select,
    update,
)

from dashboard.core import crypto, tracing
from dashboard.core.clock import from_unix, unix
from dashboard.core.outages import REDIS_AWAY, database_outage, database_unavailable, retry_on_lost_connection
from dashboard.delivery import http, oauth, tls
from dashboard.delivery.policies import Decision, Outcome, decide, policy_for
from dashboard.delivery.ratelimit import RateLimiter, at_turn
from dashboard.models import (
    TEST_EVENT_TYPE,
    Attempt,
    Consumer,
    Delivery,
    DeliveryState,
    Event,
    Subscription,
    SubscriptionState,
    delivering_state,
    held_values,
    previous_signs,
)
from dashboard.queue.work import HEARTBEAT_SECONDS, is_spare, split_item, work_item
from dashboard.stats import outcomes

log = logging.getLogger(__name__)

DELIVERIES = Delivery.__table__
EVENTS = Event.__table__
SUBSCRIPTIONS = Subscription.__table__
CONSUMERS = Consumer.__table__
ATTEMPTS = Attempt.__table__

POP_BATCH = 200
# Claimed deliveries kept in one drain (in flight + waiting for their subscription), per in-flight slot.
LOCAL_CAPACITY = 4
# A subscription holding its team's whole share with requests this old is slow: the team's other work is popped
# and started beside it (_Drain.concentrated_teams). A healthy endpoint's requests end well before.
CONCENTRATED_SECONDS = 0.5
# ... and then popped this often, not at every turn of the loop: each pop hands the slow one's work back to Redis.
BESIDE_POP_SECONDS = 0.25
# A saturated subscription keeps about this many seconds of work waiting here; the rest is handed back.
WAIT_TARGET_SECONDS = 2.0
# A handed-back delivery is due again no sooner than this, and no later than the cap (so an
# endpoint that recovers gets its backlog within a minute).
SATURATED_RETRY_SECONDS = 1.0
MAX_DEFER_SECONDS = 60.0
# Finished attempts are written in batches of at most this many rows.
RECORD_BATCH = 200
# ... or when the oldest has waited this long: bigger batches at low rates, and the receiver already has them.
RECORD_DELAY_SECONDS = 0.05
# How often an idle drain looks for new work, and the longest single blocking wait for it.
POLL_SECONDS = 0.005
LINGER_POLL_SECONDS = 0.5
# After a pop that emptied the list without filling the drain's in-flight slots, the next waits this
# long, so that work arriving one delivery at a time is claimed, sent and recorded many at a time: a pop,
# a claim, a record and their thread hand-offs cost nearly the same for one delivery as for twenty, and
# requests sent together are answered together (one wake-up of the loop for several answers). A pop that
# fills the slots is followed at once: the worker has enough to do, and waiting then only idles it.
# The first delivery after a quiet spell is taken as soon as it arrives.
GATHER_SECONDS = 0.05


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The drain's event loop: uvloop's where it is installed (cheaper per delivery), asyncio's own otherwise:
    the loop's own bookkeeping and the transports' reads and writes are most of what is not aiohttp's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _gathers_next(taken: int, asked: int, in_flight_slots: int) -> bool:
    """Did this pop empty the list with fewer deliveries than the drain can send at once (so the next
    should let arrivals gather)? Tied to the drain's slots, not a fixed count, so pops of a few are rare."""
    return 0 < taken < min(asked, in_flight_slots)


# A waiting delivery is started only while this much of its lease is left unused.
LEASE_SAFETY = 0.5
# A failed drain waits this long for the database to record what it sent (well inside the drain job's timeout).
OUTAGE_WAIT_SECONDS = 120.0
# Leases of what a drain holds (in flight, waiting, being recorded) are renewed this often, as a
# fraction of the lease: a lease can be short (a killed worker's work comes free soon) and still
# cover a delivery that waits behind a slow endpoint for longer than that.
LEASE_RENEW_FRACTION = 1 / 3

_ATTEMPT_COLUMNS = ("delivery_id", "number", "attempted_at", "duration_ms", "status_code", "error",
                    "response_excerpt", "response_headers")
_COPY_ATTEMPTS = f"COPY attempts ({', '.join(_ATTEMPT_COLUMNS)}) FROM STDIN"


def _by_ids(array: bool):
    """Rows whose id is in the "ids" parameter. On PostgreSQL one array parameter: the statement text
    is the same for any number of ids, so psycopg prepares it once and the server plans it once."""
    if array:
        return DELIVERIES.c.id == any_(bindparam("ids", type_=ARRAY(String)))
    return DELIVERIES.c.id.in_(bindparam("ids", expanding=True))


# The claim, built once (statement construction and cache keys cost more than the query here).
# Only the primary key may find the rows: the rest of the condition is wrapped in IS TRUE, which
# no index matches. On a queue table the statistics are always stale (rows turn due and settled by
# the thousand between ANALYZEs), and a plan through ix_deliveries_due reads every due row for each claim.
# Plain equalities, not IN (...): a constant IN list is an expanding parameter, rendered anew at every
# execution (with its casts).
_DUE_STATE = or_(*(DELIVERIES.c.state == state for state in DeliveryState.DUE))


def _claim(array: bool):
    return (
        update(DELIVERIES)
        .where(_by_ids(array),
               and_(_DUE_STATE, DELIVERIES.c.next_attempt_at <= bindparam("now"),
                    or_(DELIVERIES.c.lease_expires_at.is_(None),
                        DELIVERIES.c.lease_expires_at < bindparam("now"))).is_(True))
        .values(lease_token=bindparam("token"), lease_expires_at=bindparam("until"))
    )


def claim_statement():
    """The claim (due, not leased, by id), for pull delivery, which leases what its client takes the same way."""
    return _claim(array=False)


# The claim unpacks rows by position: these follow Claimed's fields from event_id on.
_SENDING_COLUMNS = (EVENTS.c.id.label("event_id"), EVENTS.c.type, EVENTS.c.created_at, EVENTS.c.body,
                    SUBSCRIPTIONS.c.id.label("subscription_id"),
                    delivering_state(SUBSCRIPTIONS, CONSUMERS).label("state"), SUBSCRIPTIONS.c.url,
                    SUBSCRIPTIONS.c.secret_ciphertext, SUBSCRIPTIONS.c.signature_scheme, SUBSCRIPTIONS.c.retry_policy,
                    SUBSCRIPTIONS.c.max_age_seconds, SUBSCRIPTIONS.c.connect_timeout, SUBSCRIPTIONS.c.attempt_timeout,
                    SUBSCRIPTIONS.c.previous_secret_ciphertext, SUBSCRIPTIONS.c.previous_secret_expires_at,
                    SUBSCRIPTIONS.c.rate_limit_per_s, SUBSCRIPTIONS.c.max_in_flight,
                    cast(SUBSCRIPTIONS.c.team_id, String).label("team_id"), CONSUMERS.c.uid.label("consumer_uid"),
                    SUBSCRIPTIONS.c.headers_ciphertext, SUBSCRIPTIONS.c.auth_ciphertext,
                    SUBSCRIPTIONS.c.tls_ciphertext, EVENTS.c.traceparent)
_CLAIM = _claim(array=False).returning(DELIVERIES.c.id)
_LOAD = (
    select(DELIVERIES.c.id, DELIVERIES.c.attempt_count, DELIVERIES.c.retry_base, DELIVERIES.c.schedule_started_at,
           *_SENDING_COLUMNS)
    .select_from(DELIVERIES.join(EVENTS, DELIVERIES.c.event_key == EVENTS.c.key)
                 .join(SUBSCRIPTIONS, DELIVERIES.c.subscription_id == SUBSCRIPTIONS.c.id)
                 .outerjoin(CONSUMERS, SUBSCRIPTIONS.c.consumer_id == CONSUMERS.c.id))
    .where(DELIVERIES.c.id.in_(bindparam("claimed", expanding=True)))  # by primary key: lease_token has no index
)
# PostgreSQL: claim and load in one round trip, the UPDATE in a CTE.
_claimed_cte = _claim(array=True).returning(
    DELIVERIES.c.id, DELIVERIES.c.attempt_count, DELIVERIES.c.retry_base, DELIVERIES.c.schedule_started_at,
    DELIVERIES.c.event_key, DELIVERIES.c.subscription_id).cte("claimed")
_CLAIM_AND_LOAD = (
    select(_claimed_cte.c.id, _claimed_cte.c.attempt_count, _claimed_cte.c.retry_base,
           _claimed_cte.c.schedule_started_at, *_SENDING_COLUMNS)
    .select_from(_claimed_cte.join(EVENTS, _claimed_cte.c.event_key == EVENTS.c.key)
                 .join(SUBSCRIPTIONS, _claimed_cte.c.subscription_id == SUBSCRIPTIONS.c.id)
                 .outerjoin(CONSUMERS, SUBSCRIPTIONS.c.consumer_id == CONSUMERS.c.id))
)


# Recording, also built once: one UPDATE per group of deliveries settled alike, and one
# executemany for those with a next attempt.
def _settle(array: bool):
    return (
        update(DELIVERIES).where(_by_ids(array), DELIVERIES.c.lease_token == bindparam("token"))
        .values(state=bindparam("state"), attempt_count=bindparam("attempt_count"), next_attempt_at=None,
                last_status_code=bindparam("status_code"), last_error=bindparam("error"),
                updated_at=bindparam("now"), succeeded_at=bindparam("succeeded_at"),
                dead_lettered_at=bindparam("dead_lettered_at"), lease_token=None, lease_expires_at=None)
    )


_SETTLE = {False: _settle(array=False), True: _settle(array=True)}  # by "is the database PostgreSQL"
# A failed attempt's next try, unless the subscription was paused or disabled while it was in flight:
# then the delivery is held (the subscription's state now, and its consumer's, read in the same statement, not
# at claim time).
_SUBSCRIPTION_ACTIVE = select(delivering_state(SUBSCRIPTIONS, CONSUMERS)) \
    .select_from(SUBSCRIPTIONS.outerjoin(CONSUMERS, SUBSCRIPTIONS.c.consumer_id == CONSUMERS.c.id)) \
    .where(SUBSCRIPTIONS.c.id == DELIVERIES.c.subscription_id).scalar_subquery() == SubscriptionState.ACTIVE
_RESCHEDULE = (
    update(DELIVERIES)
    .where(and_(DELIVERIES.c.id == bindparam("b_id"), DELIVERIES.c.lease_token == bindparam("b_token")))
    .values(state=case((_SUBSCRIPTION_ACTIVE, bindparam("state")), else_=DeliveryState.HELD),
            attempt_count=bindparam("attempt_count"),
            next_attempt_at=bindparam("next_attempt_at"),
            last_status_code=bindparam("last_status_code"), last_error=bindparam("last_error"),
            updated_at=bindparam("updated_at"), succeeded_at=None, dead_lettered_at=None,
            lease_token=None, lease_expires_at=None)
)


@dataclass(slots=True)
class Claimed:
    delivery_id: str
    attempt_number: int
    attempts_in_schedule: int  # this attempt's place in the retry schedule (restarts on replay)
    event_id: str
    event_type: str
    schedule_started_at: dt.datetime  # when this retry schedule began: accepted, or last replayed
    body: bytes
    subscription_id: str
    subscription_state: str
    url: str
    secret_ciphertext: str
    scheme: str
    retry_policy: str
    max_age_seconds: int
    connect_timeout: float
    attempt_timeout: float
    previous_secret_ciphertext: str | None  # signs too, until previous_secret_expires_at (a rotation's grace)
    previous_secret_expires_at: dt.datetime | None
    rate_limit_per_s: float | None  # across all workers (delivery.ratelimit); None: no limit
    max_in_flight: int | None  # per worker; None: PROMESA_MAX_IN_FLIGHT_PER_SUBSCRIPTION
    team_id: str  # the tenant whose share of the in-flight slots it takes (see _Run.may_start)
    consumer_uid: str | None  # the consumer it is for, sent as X-Promesa-Consumer (None: the team's own endpoint)
    headers_ciphertext: str | None  # the receiver's own headers, encrypted (None: none)
    auth_ciphertext: str | None  # OAuth2 client credentials, encrypted (None: no token)
    tls_ciphertext: str | None  # a client certificate, its key and CA bundle, encrypted (None: none)
    traceparent: str | None  # the producer's, sent on every attempt (dashboard.core.tracing); None: none
    turn: float | None = None  # unix time its rate limit lets it go, when it has one (delivery.ratelimit)


def loaded(rows) -> list[Claimed]:
    """Claimed deliveries from rows of _LOAD or _CLAIM_AND_LOAD."""
    # Unpacked by position: a Row's attribute lookup, 16 per row, costs more than the claim's SQL.
    return [Claimed(delivery_id, attempts + 1, attempts + 1 - retry_base, event_id, event_type,
                    schedule_started_at or created_at, body.encode("utf-8"), *sending)
            for delivery_id, attempts, retry_base, schedule_started_at, event_id, event_type, created_at, body,
            *sending in rows]


def load(conn, ids: list[str]) -> list[Claimed]:
    """These deliveries (leased by the caller) with what sending or handing them out needs."""
    return loaded(conn.execute(_LOAD, {"claimed": ids}).all()) if ids else []


class _Decided(NamedTuple):
    """A finished attempt, and what follows from it: its next state and its attempt row."""
    item: Claimed
    token: str
    attempted_at: dt.datetime
    result: http.AttemptResult
    outcome: Outcome
    decision: Decision
    attempt: tuple


@dataclass
class DrainStats:
    claimed: int = 0
    attempted: int = 0
    succeeded: int = 0
    held: int = 0
    deferred: int = 0
    parked: int = 0  # left in Redis, never claimed: their subscription was saturated here
    throttled: int = 0  # handed back to wait for their endpoint's rate limit: not attempts
    skipped: int = 0
    claims: int = 0  # claim transactions, and record transactions: deliveries per transaction is what the database feels
    records: int = 0
    peak_in_flight: int = 0  # the most requests in flight at once, and per team (str id): fairness is checked by these
    peak_by_team: Counter = field(default_factory=Counter)
    peak_shared_by_team: Counter = field(default_factory=Counter)  # ... started while other teams had work waiting
    spare_ended: bool = False  # a spare drain that ended early: another drain took the trickle alone
    states: Counter = field(default_factory=Counter)


class DeliveryEngine:
    def __init__(self, app, work, clock, rng: random.Random | None = None, keep_alive: bool = False):
        self.app = app
        self.db_engine = app.extensions["sqlalchemy"].engine
        self.work = work
        self.clock = clock
        self.rng = rng or random.Random()
        cfg = app.config
        self.lease_seconds = cfg["PROMESA_LEASE_SECONDS"]
        self.max_in_flight = cfg["PROMESA_MAX_IN_FLIGHT"]
        self.per_subscription = cfg["PROMESA_MAX_IN_FLIGHT_PER_SUBSCRIPTION"]
        self.excerpt_bytes = cfg["PROMESA_RESPONSE_EXCERPT_BYTES"]
        self.allow_private = cfg["PROMESA_ALLOW_PRIVATE_TARGETS"]
        self._secrets: dict[str, str] = {}
        self.tls = tls.Contexts(self._secret)  # client certificates, one SSLContext per setting
        self.tokens = oauth.Tokens(clock, self._secret, self.allow_private)  # OAuth2 bearer tokens, this worker's
        # keep_alive: one event loop and one pooled HTTP session for every drain of this engine.
        self.keep_alive = keep_alive
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._avg_seconds: dict[str, float] = {}  # per subscription, how long a request takes here
        self._booked_until: dict[str, float] = {}  # per subscription, the latest deferred due time handed out
        # Learned from claims: the rate limit of each subscription that has one, and in-flight caps set per
        # subscription. Work for a subscription not in rate_limits never costs a limiter call.
        self.limiter = RateLimiter(work.conn, cfg["PROMESA_REDIS_PREFIX"], cfg["PROMESA_RATE_LIMIT_LOOKAHEAD_SECONDS"])
        self.rate_limits: dict[str, float] = {}
        self.in_flight_caps: dict[str, int] = {}
        # Set from another thread (a worker asked to stop): the drain ends as at the end of its budget,
        # handing back what waits and recording what is in flight.
        self.stopping = threading.Event()

    # -- database ------------------------------------------------------------------
    def claim(self, ids: list[str]) -> tuple[list[Claimed], str | None]:
        """Lease the given deliveries that are due and free; return them with what sending needs."""
        if not ids:
            return [], None
        now = self.clock.now()
        token = str(uuid.uuid4())
        params = {"ids": ids, "now": now, "token": token,
                  "until": now + dt.timedelta(seconds=self.lease_seconds)}

        def lease():
            if self.db_engine.dialect.name == "postgresql":
                # One statement, atomic on its own (the UPDATE in a CTE), so in autocommit: without BEGIN
                # and COMMIT it is one round trip instead of three, and a claim of one or two deliveries
                # (work arriving an event at a time) is most of what the database does for them.
                with self.db_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    return conn.execute(_CLAIM_AND_LOAD, params).all()
            with self.db_engine.begin() as conn:
                claimed = conn.execute(_CLAIM, params).scalars().all()
                return conn.execute(_LOAD, {"claimed": claimed}).all() if claimed else []

        # Safe to repeat: a claim that did commit before the connection died only leases rows to a
        # token nobody holds, and they come free when that lease runs out.
        rows = retry_on_lost_connection(lease, "claiming deliveries")
        if not rows:
            return [], None
        return loaded(rows), token

    def hold(self, items: list[Claimed], token: str) -> None:
        """The subscription is paused or disabled: keep the delivery, do not attempt it."""
        if not items:
            return

        def write():
            with self.db_engine.begin() as conn:
                conn.execute(update(DELIVERIES)
                             .where(DELIVERIES.c.id.in_([i.delivery_id for i in items]),
                                    DELIVERIES.c.lease_token == token)
                             .values(state=DeliveryState.HELD, updated_at=self.clock.now(),
                                     lease_token=None, lease_expires_at=None))

        retry_on_lost_connection(write, "holding deliveries")

    def release(self, unsent: list[tuple[Claimed, str]]) -> None:
        """Give back claimed deliveries that were not sent, due at once, and put them back in Redis
        (if Redis is away, the sweeper finds them: they are due and no longer leased)."""
        if not unsent:
            return
        self.unlease(unsent)
        try:
            self.work.push([work_item(item.subscription_id, item.delivery_id) for item, _ in unsent])
        except REDIS_AWAY:
            log.warning("Redis is away: %d released deliveries wait for the sweeper", len(unsent))
        except redis.exceptions.OutOfMemoryError as full:
            log.warning("Redis is full: %d released deliveries wait for the sweeper",
                        getattr(full, "left", len(unsent)))

    def unlease(self, claimed: list[tuple[Claimed, str]]) -> None:
        """Free these (delivery, lease token) pairs as they were, without an attempt: due for whoever comes next."""
        by_token: dict[str, list[str]] = {}
        for item, token in claimed:
            by_token.setdefault(token, []).append(item.delivery_id)

        def write():
            with self.db_engine.begin() as conn:
                for token, ids in by_token.items():
                    conn.execute(update(DELIVERIES).where(DELIVERIES.c.id.in_(ids), DELIVERIES.c.lease_token == token)
                                 .values(lease_token=None, lease_expires_at=None))

        retry_on_lost_connection(write, "releasing unsent deliveries")

    def renew(self, held: dict[str, list[str]]) -> None:
        """Extend the leases of deliveries this drain still holds ({lease token: delivery ids}): one
        statement by primary key, every lease_seconds * LEASE_RENEW_FRACTION, whatever the rate."""
        ids = [delivery_id for batch in held.values() for delivery_id in batch]
        until = self.clock.now() + dt.timedelta(seconds=self.lease_seconds)

        def write():
            with self.db_engine.begin() as conn:
                # Locked in id order, as the attempts' write locks its batch (which this may include): in two
                # orders the two deadlocked, and PostgreSQL took a second (deadlock_timeout) to break it.
                locked = conn.execute(select(DELIVERIES.c.id)
                                      .where(DELIVERIES.c.id.in_(ids), DELIVERIES.c.lease_token.in_(list(held)))
                                      .order_by(DELIVERIES.c.id).with_for_update()).scalars().all()
                if locked:
                    conn.execute(update(DELIVERIES).where(DELIVERIES.c.id.in_(locked)).values(lease_expires_at=until))

        retry_on_lost_connection(write, "renewing leases")

    def record(self, finished: list[tuple[Claimed, str, dt.datetime, http.AttemptResult]], stats: DrainStats) -> None:
        """Write the attempts and the next state of every delivery in one transaction, then schedule retries.
        Only the deliveries that still carry the lease they were sent under are written: a batch written
        already (a write that failed late), or one whose lease ran out and another worker took over (this
        one was cut off for longer than the lease), is refused, so no attempt is ever recorded twice."""
        if not finished:
            return
        now = self.clock.now()
        decided: list[_Decided] = []
        for item, token, attempted_at, result in finished:
            outcome = result.outcome
            attempt = (item.delivery_id, item.attempt_number, attempted_at, result.duration_ms,
                       outcome.status_code, outcome.error, result.response_excerpt, result.response_headers)
            try:
                decision = decide(policy_for(item.retry_policy, item.max_age_seconds), outcome,
                                  item.attempts_in_schedule, item.schedule_started_at, now, self.rng)
            except Exception as exc:  # noqa: BLE001 - a bug in one decision is that attempt's error, not the batch's
                outcome, decision = self._fallback_decision(item, exc, now)
                attempt = attempt[:5] + (outcome.error,) + attempt[6:]
            decided.append(_Decided(item, token, attempted_at, result, outcome, decision, attempt))
            stats.attempted += 1
            stats.states[decision.state] += 1

        def write() -> list[_Decided]:
            with self.db_engine.begin() as conn:
                leased = self._still_leased(conn, finished)
                kept = [d for d in decided if d.item.delivery_id in leased]
                if kept:
                    self._write(conn, kept, now)
                return kept

        kept = retry_on_lost_connection(write, "recording attempts")
        if len(kept) < len(decided):
            log.warning("%d attempts not recorded: their leases had run out and another worker took them over, "
                        "or they were recorded already", len(decided) - len(kept))
        to_schedule = [(work_item(d.item.subscription_id, d.item.delivery_id), unix(d.decision.next_attempt_at))
                       for d in kept  # a pull one waits for its client
                       if d.decision.state == DeliveryState.SCHEDULED and d.item.url is not None]
        # After the commit: if Redis is away, the retry is only delayed until the sweeper finds it.
        try:
            self.work.schedule(to_schedule)
        except REDIS_AWAY:
            log.warning("Redis is away: %d retries wait for the sweeper", len(to_schedule))

    def _write(self, conn, decided: list[_Decided], now: dt.datetime) -> None:
        """The attempt rows and next states of these attempts, whose leases the transaction holds."""
        attempts, updates, to_disable = [], [], {}
        settled: dict[tuple, list[str]] = {}  # finished for now (no next attempt): one UPDATE per kind
        counts: dict[tuple[str, dt.datetime], list[int]] = {}  # per (subscription, minute), for charts and alerts
        for item, token, attempted_at, result, outcome, decision, attempt in decided:
            attempts.append(attempt)
            if item.event_type != TEST_EVENT_TYPE:
                count = counts.setdefault((item.subscription_id, outcomes.minute_of(attempted_at)), [0, 0, 0, 0])
                count[0 if outcome.succeeded else 1] += 1
                count[2] += decision.state == DeliveryState.DEAD
                count[3] += result.duration_ms
            if decision.next_attempt_at is None:
                key = (token, decision.state, item.attempt_number, outcome.status_code, outcome.error)
                settled.setdefault(key, []).append(item.delivery_id)
            else:
                updates.append({
                    "b_id": item.delivery_id, "b_token": token, "state": decision.state,
                    "attempt_count": item.attempt_number, "next_attempt_at": decision.next_attempt_at,
                    "last_status_code": outcome.status_code, "last_error": outcome.error, "updated_at": now,
                })
            if decision.disable_subscription:
                to_disable[item.subscription_id] = decision.disable_subscription
        self._insert_attempts(conn, attempts)
        outcomes.add(conn, counts)
        for (token, state, attempt_count, status_code, error), ids in settled.items():
            conn.execute(_SETTLE[conn.dialect.name == "postgresql"], {
                "ids": ids, "token": token, "state": state, "attempt_count": attempt_count,
                "status_code": status_code, "error": error, "now": now,
                "succeeded_at": now if state == DeliveryState.SUCCEEDED else None,
                "dead_lettered_at": now if state == DeliveryState.DEAD else None})
        if updates:
            conn.execute(_RESCHEDULE, updates)
        for subscription_id, reason in to_disable.items():
            # In the batch's transaction, so a 410 and its disable commit together (audited later: autodisable).
            conn.execute(update(SUBSCRIPTIONS)
                         .where(SUBSCRIPTIONS.c.id == subscription_id,
                                SUBSCRIPTIONS.c.state == SubscriptionState.ACTIVE)
                         .values(**held_values(SubscriptionState.DISABLED, reason), updated_at=now))

    def through_outage(self, write, *args):
        """Run `write(*args)`; with the database away, wait up to OUTAGE_WAIT_SECONDS for it and run it
        once more. For what a failed drain still owes: attempts already sent (a record that committed after
        all is refused the second time: its leases are gone) and claimed work given back."""
        try:
            return write(*args)
        except Exception as error:  # noqa: BLE001 - only the database being away is waited out
            if not database_unavailable(error):
                raise
            database_outage.failed(error, "worker")
        if not database_outage.wait_until_back(self.db_engine, "worker", timeout=OUTAGE_WAIT_SECONDS):
            raise TimeoutError(f"the database stayed away for {OUTAGE_WAIT_SECONDS} s")
        return write(*args)

    def _fallback_decision(self, item: Claimed, exc: Exception, now: dt.datetime) -> tuple[Outcome, Decision]:
        """A decision for an attempt whose own decision failed (a bug): its error, and the default schedule."""
        log.exception("deciding the next state of delivery %s failed", item.delivery_id)
        outcome = Outcome(error=http.error_text("internal error", exc))
        return outcome, decide(policy_for("exponential"), outcome, item.attempts_in_schedule,
                               item.schedule_started_at, now, self.rng)

    @staticmethod
    def _still_leased(conn, finished) -> set[str]:
        """The deliveries of this batch that still carry the lease they were sent under, locked until the
        batch is written: another worker's claim (of a lease run out) waits for the write, or came first.
        A delivery cancelled in flight (its subscription deleted: the lease taken back, never claimed again)
        keeps its attempt too; the state, settled by lease token, stays cancelled."""
        sent_under = {(item.delivery_id, token) for item, token, *_ in finished}
        rows = conn.execute(select(DELIVERIES.c.id, DELIVERIES.c.lease_token)
                            .where(DELIVERIES.c.id.in_([delivery_id for delivery_id, _ in sent_under]),
                                   or_(DELIVERIES.c.lease_token.in_(list({token for _, token in sent_under})),
                                       and_(DELIVERIES.c.lease_token.is_(None),
                                            DELIVERIES.c.state == DeliveryState.CANCELLED)))
                            .order_by(DELIVERIES.c.id).with_for_update())
        return {delivery_id for delivery_id, token in rows if token is None or (delivery_id, token) in sent_under}

    def _insert_attempts(self, conn, rows: list[tuple]) -> None:
        """Attempt rows in bulk: COPY on PostgreSQL (far less CPU than executemany), executemany elsewhere."""
        if conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg":
            cursor = conn.connection.dbapi_connection.cursor()
            with cursor.copy(_COPY_ATTEMPTS) as copy:
                for row in rows:
                    copy.write_row(row)
            return
        conn.execute(ATTEMPTS.insert(), [dict(zip(_ATTEMPT_COLUMNS, row)) for row in rows])

    def _secret(self, ciphertext: str) -> str:
        secret = self._secrets.get(ciphertext)
        if secret is None:
            with self.app.app_context():
                secret = self._secrets[ciphertext] = crypto.decrypt(ciphertext)
        return secret

    def own_headers(self, ciphertext: str | None) -> dict[str, str]:
        """The receiver's own headers, decrypted once per ciphertext (an edit makes a new one)."""
        if not ciphertext:
            return {}
        return json.loads(self._secret(ciphertext))

    def signing_secrets(self, item: Claimed, attempted_at: dt.datetime) -> list[str]:
        """The newest secret, then the previous one while its grace lasts (by the injected clock)."""
        secrets = [self._secret(item.secret_ciphertext)]
        if item.previous_secret_ciphertext and previous_signs(item.previous_secret_expires_at, attempted_at):
            secrets.append(self._secret(item.previous_secret_ciphertext))
        return secrets

    # -- the loop -------------------------------------------------------------------
    def drain(self, slot_token: str | None = None, budget_seconds: float = 30.0,
              linger_seconds: float = 0.0) -> DrainStats:
        """Deliver ready work until the list stays empty for `linger_seconds` or the budget is spent."""
        with tracing.span("promesa.drain") as span:  # each attempt's span is its child, unless its event has a trace
            stats = self._drain_in_loop(slot_token, budget_seconds, linger_seconds)
            tracing.annotate(span, **{"promesa.claimed": stats.claimed, "promesa.attempted": stats.attempted,
                                      "promesa.succeeded": stats.succeeded})
            return stats

    def _drain_in_loop(self, slot_token: str | None, budget_seconds: float, linger_seconds: float) -> DrainStats:
        if not self.keep_alive:
            with asyncio.Runner(loop_factory=new_event_loop) as runner:
                return runner.run(self._drain_once(slot_token, budget_seconds, linger_seconds))
        if self._loop is None or self._loop.is_closed():
            self._loop = new_event_loop()
        return self._loop.run_until_complete(self._drain(slot_token, budget_seconds, linger_seconds))

    def close(self) -> None:
        """Close the kept session and event loop (a keep-alive engine lives as long as its worker)."""
        if self._loop is not None and not self._loop.is_closed():
            if self._session is not None:
                self._loop.run_until_complete(self._session.close())
            self._loop.close()
        self._session = None

    async def _drain_once(self, slot_token, budget_seconds, linger_seconds) -> DrainStats:
        try:
            return await self._drain(slot_token, budget_seconds, linger_seconds)
        finally:
            if self._session is not None:
                await self._session.close()
                self._session = None

    def _session_here(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # Kept across drain jobs by a keep-alive engine. Twice the slots: a team under its fair share
            # starts even while another holds them all.
            self._session = http.client_session(2 * self.max_in_flight, self.allow_private)
        return self._session

    async def _drain(self, slot_token, budget_seconds, linger_seconds) -> DrainStats:
        run = _Drain(self, self._session_here(), DrainStats())
        try:
            return await self._drain_loop(run, slot_token, budget_seconds, linger_seconds)
        except BaseException as exc:
            if isinstance(exc, REDIS_AWAY):
                log.error("drain stopped: Redis is unreachable (%s); recording what was sent, releasing the rest", exc)
            elif database_unavailable(exc):  # one line per outage, not a traceback per drain
                database_outage.failed(exc, "worker")
            else:
                log.critical("drain failed; recording what was sent and releasing the rest", exc_info=True)
            await run.abandon()
            raise

    async def _drain_loop(self, run: _Drain, slot_token, budget_seconds, linger_seconds) -> DrainStats:
        started = time.monotonic()
        deadline = started + budget_seconds
        # Past its budget, a drain still holding requests (a slow endpoint's) goes on serving work that
        # ends before they do, until the last of them has timed out at the latest (and what it started
        # meanwhile): a drain that stopped popping at its budget left every other team waiting up to an
        # attempt's timeout (one worker runs one drain at a time). A stopping worker ends without that grace.
        closing_at = None
        grace_ends_at = latest_end = 0.0
        next_heartbeat = started + HEARTBEAT_SECONDS
        busy = False  # since the last heartbeat, did a pop take all it asked for (more work than this drain)?
        renew_every = self.lease_seconds * LEASE_RENEW_FRACTION
        next_renewal = started + renew_every
        idle_since = None
        next_pop = 0.0  # after an empty pop: do not ask Redis on every completion
        polled_skip: set = set()  # the teams that empty pop skipped
        gather_until = 0.0  # after a small pop that emptied the list: let arrivals gather
        next_beside_pop = 0.0  # when a team held by one slow subscription may be popped again
        while True:
            now = time.monotonic()
            if self.stopping.is_set():
                deadline = closing_at = min(deadline, now)
            if closing_at is None and now >= deadline:
                closing_at = max([deadline, *(began + item.attempt_timeout + 1.0
                                              for item, _, _, began in run.in_flight.values())])
                grace_ends_at = closing_at
                # What starts in the grace may carry it on while it is on the wire, once by as long again
                # at most: the drain serves until then instead of waiting idle for its last requests.
                latest_end = closing_at + (closing_at - deadline)
            if closing_at is not None and not self.stopping.is_set():
                closing_at = run.closing_at = min(latest_end, max([grace_ends_at, *(
                    began + item.attempt_timeout + 1.0 for item, _, _, began in run.in_flight.values())]))
            if now >= next_renewal:
                run.renew_leases()
                next_renewal = now + renew_every
            popped = 0
            if run.claiming is not None and run.claiming.done():
                await run.take_claimed()
            # Teams at their share here leave their work in Redis; the room they would have taken (and
            # as much again) stays open to the others, so that a newcomer is never behind them.
            least_share = self.max_in_flight // (len(run.active) + 1)  # no team is full below it
            full = run.full_teams() if run.slots >= least_share or run.local >= LOCAL_CAPACITY * least_share else ()
            room = min(POP_BATCH, LOCAL_CAPACITY * self.max_in_flight * (2 if full else 1) - run.local)
            # A team with work waiting here is refilled only once half the room is free: a claim of a few
            # deliveries costs the database nearly what a claim of a hundred does. Until then pops skip it,
            # and only it: one team's backlog here never keeps another team's work in Redis.
            skip = full
            if run.waiting_total and room < min(POP_BATCH, LOCAL_CAPACITY * self.max_in_flight // 2):
                skip = {*full, *run.team_waiting}
            # A full team whose share one slow subscription holds is popped now and then all the same: its other
            # subscriptions' work (another consumer's) starts beside it (may_start), the slow one's goes back (admit).
            beside = set()
            if now >= next_beside_pop:  # at most this often: it walks every subscription the drain has served
                run.beside = run.concentrated_teams() if full else set()
                beside = run.beside & set(full)
                if beside:
                    skip = [team for team in skip if team not in beside]
                if full:
                    next_beside_pop = now + BESIDE_POP_SECONDS
            # After a pop that skipped teams and found nothing, the next waits a little (a newcomer is all it
            # can find), unless a team has stopped being skipped.
            if ((closing_at is None or now < closing_at) and run.claiming is None and room > 0
                    and (len(run.in_flight) < self.max_in_flight or skip or beside) and now >= gather_until
                    and (now >= next_pop or not polled_skip <= set(skip))):
                items = self.work.pop_ready(room, skip)
                popped = len(items)
                busy = busy or popped == room
                if not popped:
                    next_pop, polled_skip = now + (GATHER_SECONDS if skip else POLL_SECONDS), set(skip)
                elif _gathers_next(popped, room, self.max_in_flight):
                    gather_until = now + GATHER_SECONDS
                ids = await run.admit(items)
                if ids:
                    run.start_claim(ids)
            if (run.in_flight or run.claiming is not None) and not popped:
                await run.wait(POLL_SECONDS)
            run.collect()
            closed = closing_at is not None and now >= closing_at
            if closed and slot_token and run.in_flight and not self.stopping.is_set():
                # Taking no more work, only waiting for requests that outlive the grace: while this drain beat
                # on, no successor started, and work arriving meanwhile waited for them.
                await asyncio.to_thread(self.work.release, slot_token)
                slot_token = None
            await run.settle(final=closed)
            if run.finished and (len(run.finished) >= RECORD_BATCH
                                 or now - run.first_finished_at >= RECORD_DELAY_SECONDS):
                await run.flush()
            if not run.in_flight and not run.waiting_total and not popped and run.claiming is None:
                if run.finished and now < deadline:
                    wait = max(0.001, RECORD_DELAY_SECONDS - (now - run.first_finished_at))
                else:
                    await run.flush(wait=True)
                    if now >= deadline:  # nothing in flight: the budget's end is the end
                        break
                    idle_since = idle_since or now
                    if now - idle_since >= linger_seconds and now >= gather_until:
                        break
                    wait = max(0.01, min(LINGER_POLL_SECONDS, linger_seconds - (now - idle_since)))
                if now < gather_until:  # work came a moment ago: more is likely on its way
                    await asyncio.sleep(min(wait, gather_until - now))
                else:
                    # Nothing in flight: wait for new work in Redis (keeping the warm pool) rather than end.
                    count = min(POP_BATCH, self.max_in_flight)
                    items = await asyncio.to_thread(self.work.wait_ready, count, wait)
                    busy = busy or len(items) == count
                    if _gathers_next(len(items), count, self.max_in_flight):
                        gather_until = time.monotonic() + GATHER_SECONDS
                    ids = await run.admit(items)
                    if ids:
                        await run.take(ids, await asyncio.to_thread(self.claim, ids))
                    if items:
                        idle_since = None
            else:
                idle_since = None
            if slot_token and time.monotonic() > next_heartbeat:
                beating = self.work.heartbeat(slot_token)
                if not busy and is_spare(slot_token, beating):
                    # Another drain takes this trickle alone, at larger batches: end as at the budget's end.
                    # With the grace of a budget's end: its worker runs no other drain until this one ends.
                    deadline = min(deadline, time.monotonic())
                    run.stats.spare_ended = True
                busy = False
                next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
        stats = run.stats
        stats.succeeded = stats.states[DeliveryState.SUCCEEDED]
        return stats

    # -- pacing a saturated subscription ------------------------------------------------
    def expected_seconds(self, subscription_id: str, oldest_in_flight: float | None) -> float | None:
        """How long one request to this subscription takes here: the running average, or longer
        when one is already taking longer than that."""
        avg = self._avg_seconds.get(subscription_id)
        if oldest_in_flight is not None:
            avg = max(avg or 0.0, time.monotonic() - oldest_in_flight)
        return avg

    def waiting_cap(self, expected: float | None) -> int:
        """How many of one subscription's claimed deliveries may wait here: about WAIT_TARGET_SECONDS of work."""
        ceiling = LOCAL_CAPACITY * self.max_in_flight
        if not expected:
            return ceiling
        return int(max(2 * self.per_subscription, min(ceiling, self.per_subscription * WAIT_TARGET_SECONDS / expected)))

    def learn(self, subscription_id: str, seconds: float) -> None:
        avg = self._avg_seconds.get(subscription_id)
        self._avg_seconds[subscription_id] = seconds if avg is None else 0.8 * avg + 0.2 * seconds

    def _paced(self, subscription_id: str, expected: dict[str, float | None], now_unix: float) -> float:
        """When a saturated subscription's next handed-back delivery should be due: one by one at
        the pace it answers here, from a second away to at most a minute."""
        interval = (expected.get(subscription_id) or 0.0) / self.cap(subscription_id)  # at its own in-flight cap
        when = max(now_unix + SATURATED_RETRY_SECONDS, self._booked_until.get(subscription_id, 0.0) + interval)
        when = min(when, now_unix + MAX_DEFER_SECONDS)
        self._booked_until[subscription_id] = when
        return when

    def park(self, pairs: list[tuple[str, str]], expected: dict[str, float | None]) -> None:
        """Put unclaimed (subscription, delivery) pairs back in Redis, paced. No database write:
        the row is untouched, and the sweeper leaves it alone while Redis holds it."""
        now_unix = unix(self.clock.now())
        self.work.schedule([(work_item(sub, dlv), self._paced(sub, expected, now_unix)) for sub, dlv in pairs])

    def defer_paced(self, pairs: list[tuple[Claimed, str]], expected: dict[str, float | None]) -> None:
        """Hand claimed but saturated deliveries back, due one by one at the pace their subscription
        answers here, so a slow endpoint's backlog is not claimed and handed back every second."""
        if not pairs:
            return
        now = self.clock.now()
        now_unix = unix(now)
        by_token: dict[str, list[str]] = {}
        due = []
        for item, token in pairs:
            when = self._paced(item.subscription_id, expected, now_unix)
            by_token.setdefault(token, []).append(item.delivery_id)
            due.append((work_item(item.subscription_id, item.delivery_id), when))
        # One UPDATE per claim: the database gets the earliest due time (claimable from then on, and
        # the sweeper leaves it alone while Redis holds it); Redis holds each one's paced time.
        def write():
            with self.db_engine.begin() as conn:
                for token, ids in by_token.items():
                    conn.execute(update(DELIVERIES).where(DELIVERIES.c.id.in_(ids), DELIVERIES.c.lease_token == token)
                                 .values(next_attempt_at=from_unix(now_unix + SATURATED_RETRY_SECONDS),
                                         updated_at=now, lease_token=None, lease_expires_at=None))

        retry_on_lost_connection(write, "handing back deliveries")
        self.work.schedule(due)

    # -- per-subscription limits (dashboard.delivery.ratelimit) ------------------------------
    def cap(self, subscription_id: str) -> int:
        """Requests in flight to this subscription allowed in this worker."""
        return self.in_flight_caps.get(subscription_id) or self.per_subscription

    def learn_limits(self, items: list[Claimed]) -> None:
        for item in items:
            sub = item.subscription_id
            if item.rate_limit_per_s:
                self.rate_limits[sub] = item.rate_limit_per_s
            elif sub in self.rate_limits:
                del self.rate_limits[sub]
            if item.max_in_flight:
                self.in_flight_caps[sub] = item.max_in_flight
            elif sub in self.in_flight_caps:
                del self.in_flight_caps[sub]

    def throttle_unclaimed(self, limited: dict[str, list[str]]) -> tuple[list[str], int]:
        """Delivery ids of rate-limited subscriptions, before any claim: those the limiter would let go now
        (it only looks: the turn is taken just before sending), and how many went back to Redis to wait
        their turn (no database write: their rows stay due)."""
        now = unix(self.clock.now())
        go, wait = self.limiter.split({sub: (self.rate_limits[sub], [(sub, i) for i in ids])
                                       for sub, ids in limited.items()}, now, consume=False)
        self.work.schedule([(work_item(sub, delivery_id), when) for (sub, delivery_id), when in wait])
        return [delivery_id for (_, delivery_id), _ in go], len(wait)

    def throttle_claimed(self, limited: dict[str, list[Claimed]], token: str) -> set[str]:
        """Claimed deliveries of rate-limited subscriptions take their turns, just before they are sent
        (so a slow claim cannot bunch them up). Those over the rate (another worker took the turn, or the
        first claim of the subscription) are handed back: lease released, due when the limiter says.
        Returns their ids."""
        now = self.clock.now()
        go, wait = self.limiter.split({sub: (items[0].rate_limit_per_s, items) for sub, items in limited.items()},
                                      unix(now))
        for item, turn in go:
            item.turn = turn
        if not wait:
            return set()
        ids = [item.delivery_id for item, _ in wait]
        with self.db_engine.begin() as conn:  # due from the earliest turn; Redis holds each one's own
            conn.execute(update(DELIVERIES).where(DELIVERIES.c.id.in_(ids), DELIVERIES.c.lease_token == token)
                         .values(next_attempt_at=from_unix(min(when for _, when in wait)), updated_at=now,
                                 lease_token=None, lease_expires_at=None))
        self.work.schedule([(work_item(item.subscription_id, item.delivery_id), when) for item, when in wait])
        return set(ids)

    def start(self, session, item: Claimed, attempted_at: dt.datetime, timestamp: int,
              wait: float = 0.0, gate: asyncio.Semaphore | None = None) -> asyncio.Task:
        """Sign and send one attempt. `attempted_at` and its unix `timestamp`: read once for a batch of starts.
        A rate-limited one goes at its turn, `wait` seconds from now, through its endpoint's in-flight
        `gate` (delivery.ratelimit.at_turn)."""
        span, traceparent = tracing.attempt(item.traceparent, **{
            "promesa.subscription_id": item.subscription_id, "promesa.consumer": item.consumer_uid,
            "promesa.delivery_id": item.delivery_id, "promesa.attempt": item.attempt_number})
        try:
            headers = http.delivery_headers(
                event_id=item.event_id, event_type=item.event_type, delivery_id=item.delivery_id,
                attempt_number=item.attempt_number, scheme=item.scheme,
                secrets=self.signing_secrets(item, attempted_at), timestamp=timestamp, body=item.body,
                consumer=item.consumer_uid, own=self.own_headers(item.headers_ciphertext), traceparent=traceparent)
            ssl_context = self.tls.get(item.tls_ciphertext)
        except Exception as exc:  # noqa: BLE001 - e.g. a secret that no longer decrypts: this attempt's error
            log.exception("preparing delivery %s failed", item.delivery_id)
            return asyncio.get_running_loop().create_task(http.traced(span, http.failed(exc)))
        post = functools.partial(
            http.post, session, item.url, item.body, connect_timeout=item.connect_timeout,
            attempt_timeout=item.attempt_timeout, excerpt_bytes=self.excerpt_bytes,
            allow_private=self.allow_private, ssl_context=ssl_context)
        sending = post(headers) if not item.auth_ciphertext else self.tokens.authorized(
            session, item.subscription_id, item.auth_ciphertext, headers, post,
            connect_timeout=item.connect_timeout, attempt_timeout=item.attempt_timeout)
        if item.turn is not None:
            sending = at_turn(wait, sending, functools.partial(self.retake, item), gate)
        return asyncio.get_running_loop().create_task(http.traced(span, sending))

    def retake(self, item: Claimed) -> tuple[bool, float]:
        """A fresh turn for a request that missed its own: (got one, seconds until it, or until asking again:
        never long, it holds its lease meanwhile)."""
        now = unix(self.clock.now())
        got, first, next_at = self.limiter.admit({item.subscription_id: (item.rate_limit_per_s, 1)}, now)[
            item.subscription_id]
        return (True, first - now) if got else (False, min(next_at - now, max(self.limiter.lookahead, 0.05)))

    def now_for_starts(self) -> tuple[dt.datetime, int]:
        now = self.clock.now()
        return now, int(unix(now))


class _Drain:
    """The state of one drain: requests in flight, claimed deliveries waiting for their
    subscription's turn, and finished attempts waiting to be recorded."""

    def __init__(self, engine: DeliveryEngine, session, stats: DrainStats):
        self.engine, self.session, self.stats = engine, session, stats
        self.in_flight: dict[asyncio.Task, tuple[Claimed, str, dt.datetime, float]] = {}
        self.per_subscription: Counter = Counter()
        self.started_at: dict[str, list[float]] = {}  # monotonic start of each request in flight, per subscription
        self.waiting: dict[str, deque] = {}  # (item, lease token) per saturated subscription
        # Per lease token: until when (monotonic) its waiting deliveries may still be started.
        self.lease_deadlines: dict[str, float] = {}
        self.renewing: asyncio.Future | None = None
        self.waiting_total = 0
        self.finished: list = []
        self.first_finished_at = 0.0
        self.done: list[asyncio.Task] = []
        self.wake = asyncio.Event()
        self.recording: asyncio.Future | None = None
        self.recording_batch: list = []  # what `recording` writes, kept until it is written
        # The claim under way in a thread, and its ids: while the database leases them, the loop keeps sending.
        self.claiming: asyncio.Future | None = None
        self.claiming_ids: list[str] = []
        # Per rate-limited subscription: its in-flight cap for requests that waited for their turn.
        self.turn_gates: dict[str, asyncio.Semaphore] = {}
        # Fair shares (docs/scheduler.md): slots held and deliveries waiting here, per team; the teams
        # with work waiting (here or in Redis) and those active (waiting or holding slots), per refresh.
        self.slots = 0  # requests in flight that hold a slot (not those waiting for a rate limit's turn)
        self.team_slots: Counter = Counter()
        self.team_waiting: Counter = Counter()
        self.team_waiting_subs: Counter = Counter()  # per team, its subscriptions with deliveries waiting here
        self.team_of: dict[str, str] = {}  # the team of each subscription that has had a request in flight here
        self.beside: set[str] = set()  # teams held by one slow subscription, as last found (concentrated_teams)
        self.arriving_subs: dict[str, int] = {}  # per team, the subscriptions of the claim being taken
        self.wanting: frozenset = frozenset()
        self.active: frozenset = frozenset()
        self.closing_at: float | None = None  # past its budget: only requests expected to end by then start

    @property
    def local(self) -> int:
        return len(self.in_flight) + self.waiting_total + len(self.claiming_ids)

    # -- fair shares of the in-flight slots ----------------------------------------------
    def refresh(self, arriving: frozenset = frozenset()) -> bool:
        """Read who wants slots now (and the teams of `arriving` work); True if that changed (waiting
        work may start, or must wait)."""
        wanting = frozenset(self.team_waiting) | self.engine.work.waiting_teams | arriving
        active = wanting | frozenset(self.team_slots)
        changed = wanting != self.wanting or active != self.active
        self.wanting, self.active = wanting, active
        return changed

    def share(self, team: str) -> int:
        """A team's fair share of the worker's slots: an equal part among the active teams."""
        return max(1, self.engine.max_in_flight // (len(self.active) + (team not in self.active)))

    def may_start(self, item: Claimed) -> bool:
        """Within its subscription's cap, a team starts a request while it holds less than its share
        (even past the worker's slots: they are held by a team over its share, whose requests end by
        their timeout; twice the slots is the hard bound), or, past its share, on a slot no other
        team is waiting for."""
        engine = self.engine
        team, sub = item.team_id, item.subscription_id
        held = self.per_subscription[sub]
        if held >= engine.cap(sub):
            return False
        if self.closing_at is not None:
            # Past the budget, known-slow work is handed back at the end. Work this worker has not timed yet
            # starts (its timeout bounds it): refused, a newcomer's first delivery waited out the whole grace.
            expected = engine._avg_seconds.get(sub)
            if expected is not None and expected >= self.closing_at - time.monotonic():
                return False
        share = self.share(team)
        # Within the team, the same again between its subscriptions that want slots (its consumers' endpoints).
        others = self.team_waiting_subs.get(team, 0) + self.arriving_subs.get(team, 0) - (sub in self.waiting)
        part = max(1, share // (others + 1))
        # A subscription under its part of its team's share starts as a newcomer team would, even while another
        # subscription of its team holds the whole share with slow requests: one consumer's slow endpoint never
        # holds back another's.
        if self.team_slots.get(team, 0) < share or (others > 0 and held < part and team in self.beside):
            if self.slots >= 2 * engine.max_in_flight:
                return False
        elif not (self.slots < engine.max_in_flight and len(self.wanting) == (team in self.wanting)):
            return False
        return others <= 0 or held < part

    def concentrated_teams(self) -> set[str]:
        """Teams whose whole share of the slots one slow subscription holds (its oldest request in flight for
        CONCENTRATED_SECONDS). Their other subscriptions' work may start beside it (may_start), so it is popped
        from Redis every BESIDE_POP_SECONDS, and the slow one's handed back (admit)."""
        top: dict[str, tuple[int, str]] = {}
        for sub, held in self.per_subscription.items():
            if held > 0:
                team = self.team_of[sub]
                if held > top.get(team, (0, ""))[0]:
                    top[team] = held, sub
        if not top:
            return set()
        slow_since = time.monotonic() - CONCENTRATED_SECONDS
        return {team for team, (held, sub) in top.items()
                if held >= self.share(team) and min(self.started_at[sub]) < slow_since}

    def full_teams(self) -> list[str]:
        """Teams this drain can start nothing more for, or holds enough work of already: a pop leaves
        their work in Redis, so that room here goes to the other teams."""
        full = []
        for team in self.team_slots.keys() | self.team_waiting.keys():
            share = self.share(team)
            load = self.team_slots.get(team, 0) + self.team_waiting.get(team, 0)
            if load >= LOCAL_CAPACITY * share or (
                    self.team_slots.get(team, 0) >= share
                    and not (self.slots < self.engine.max_in_flight and len(self.wanting) == (team in self.wanting))):
                full.append(team)
        return full

    def _wait_here(self, item: Claimed, token: str) -> None:
        queue = self.waiting.get(item.subscription_id)
        if not queue:
            queue = self.waiting[item.subscription_id] = deque()
            self.team_waiting_subs[item.team_id] += 1
        queue.append((item, token))
        self.waiting_total += 1
        self.team_waiting[item.team_id] += 1

    def _unwait(self, item: Claimed) -> None:
        """One delivery of item's subscription left its waiting queue (already popped)."""
        team = item.team_id
        left = self.team_waiting[team] - 1
        if left > 0:
            self.team_waiting[team] = left
        else:
            del self.team_waiting[team]
        if not self.waiting[item.subscription_id]:
            del self.waiting[item.subscription_id]
            subs = self.team_waiting_subs[team] - 1
            if subs > 0:
                self.team_waiting_subs[team] = subs
            else:
                del self.team_waiting_subs[team]

    def dispatch(self) -> None:
        """Start waiting work that may start now: one delivery per subscription per pass, so that
        subscriptions (and, through may_start, teams) take free slots in turn."""
        now = time.monotonic()
        starts_at = None
        progress = True
        while progress and self.waiting_total:
            progress = False
            for queue in list(self.waiting.values()):
                if not self.may_start(queue[0][0]):
                    continue
                item, token = queue.popleft()
                self.waiting_total -= 1
                self._unwait(item)
                progress = True
                if now < self.lease_deadlines[token]:
                    starts_at = starts_at or self.engine.now_for_starts()
                    self._send(item, token, starts_at)
                # else: the lease is too close to running out to start now; the sweeper hands it on.

    def start_claim(self, ids: list[str]) -> None:
        self.claiming_ids = ids
        self.claiming = asyncio.ensure_future(asyncio.to_thread(self.engine.claim, ids))
        self.claiming.add_done_callback(lambda _: self.wake.set())

    async def take_claimed(self) -> None:
        claiming, ids = self.claiming, self.claiming_ids
        self.claiming, self.claiming_ids = None, []
        await self.take(ids, await claiming)  # raises what the claim raised: a failed claim fails the drain

    async def admit(self, items: list[str]) -> list[str]:
        """The delivery ids worth claiming now. Work for a subscription that already has its share
        in flight and waiting here goes straight back to Redis, paced, without touching the database."""
        claim, park, expected = [], [], {}
        limited: dict[str, list[str]] = {}  # by subscription, ids that must pass its rate limit first
        admitted: Counter = Counter()
        engine = self.engine
        for item in items:
            sub, delivery_id = split_item(item)
            if sub is not None:
                if sub not in expected:
                    starts = self.started_at.get(sub)
                    expected[sub] = engine.expected_seconds(sub, min(starts) if starts else None)
                load = self.per_subscription[sub] + len(self.waiting.get(sub, ())) + admitted[sub]
                if load >= engine.cap(sub) + engine.waiting_cap(expected[sub]):
                    park.append((sub, delivery_id))
                    continue
                admitted[sub] += 1
                if sub in engine.rate_limits:
                    limited.setdefault(sub, []).append(delivery_id)
                    continue
            claim.append(delivery_id)
        if park:
            self.stats.parked += len(park)
            await asyncio.to_thread(engine.park, park, expected)
        if limited:  # the limiter hook: over the rate, work waits in Redis, unclaimed
            go, waiting = await asyncio.to_thread(engine.throttle_unclaimed, limited)
            self.stats.throttled += waiting
            claim.extend(go)
        return claim

    async def take(self, ids: list[str], claimed: tuple[list[Claimed], str | None]) -> None:
        items, token = claimed
        engine, stats = self.engine, self.stats
        stats.claimed += len(items)
        stats.claims += 1
        stats.skipped += len(ids) - len(items)  # stale or duplicate ids: someone else has them, or they are done
        pulled = [item for item in items if item.url is None]
        if pulled:  # a pull subscription's (a stray work item): its own client fetches it, no worker sends it
            items = [item for item in items if item.url is not None]
            stats.skipped += len(pulled)
            await asyncio.to_thread(engine.unlease, [(item, token) for item in pulled])
        engine.learn_limits(items)
        if engine.rate_limits:
            items = await self._throttle_claimed(items, token)
        to_hold = []
        if token is not None:
            self.lease_deadlines[token] = time.monotonic() + engine.lease_seconds * LEASE_SAFETY
        now = engine.now_for_starts()
        # A claim's teams, and each team's subscriptions in it, share with each other from its first item on.
        subs_by_team: dict[str, set] = {}
        for item in items:
            subs_by_team.setdefault(item.team_id, set()).add(item.subscription_id)
        self.refresh(frozenset(subs_by_team))
        self.arriving_subs = {team: len(subs - self.waiting.keys()) - 1 for team, subs in subs_by_team.items()}
        for item in items:
            if item.subscription_state != SubscriptionState.ACTIVE:
                to_hold.append(item)
            elif item.turn is not None or self.may_start(item):
                self._send(item, token, now)
            else:
                self._wait_here(item, token)
        self.arriving_subs = {}
        if to_hold:
            await asyncio.to_thread(engine.hold, to_hold, token)
            stats.held += len(to_hold)

    async def _throttle_claimed(self, items: list[Claimed], token: str) -> list[Claimed]:
        """The limiter hook where work starts: claimed work of a rate-limited subscription takes its turn
        now, or is handed back."""
        unchecked: dict[str, list[Claimed]] = {}
        for item in items:
            if item.rate_limit_per_s and item.subscription_state == SubscriptionState.ACTIVE:
                unchecked.setdefault(item.subscription_id, []).append(item)
        if not unchecked:
            return items
        handed_back = await asyncio.to_thread(self.engine.throttle_claimed, unchecked, token)
        self.stats.throttled += len(handed_back)
        return [item for item in items if item.delivery_id not in handed_back] if handed_back else items

    def _send(self, item: Claimed, token: str, now: tuple[dt.datetime, int]) -> None:
        attempted_at, timestamp = now
        wait = 0.0 if item.turn is None else item.turn - unix(attempted_at)
        if wait > 0:  # its rate limit's turn is a moment away: signed for then, sent then
            attempted_at, timestamp = from_unix(item.turn), int(item.turn)
        sub = item.subscription_id
        began = time.monotonic()
        if item.turn is None:
            task = self.engine.start(self.session, item, attempted_at, timestamp)
            self.per_subscription[sub] += 1
            self.team_of[sub] = item.team_id
            self.started_at.setdefault(sub, []).append(began)
            self.slots += 1
            held = self.team_slots[item.team_id] = self.team_slots.get(item.team_id, 0) + 1
            stats = self.stats
            if self.slots > stats.peak_in_flight:
                stats.peak_in_flight = self.slots
            if held > stats.peak_by_team[item.team_id]:
                stats.peak_by_team[item.team_id] = held
            if len(self.wanting) > (item.team_id in self.wanting) and held > stats.peak_shared_by_team[item.team_id]:
                stats.peak_shared_by_team[item.team_id] = held
        else:  # waiting for its turn takes no in-flight place: its gate admits the endpoint's cap at once
            gate = self.turn_gates.get(sub) or self.turn_gates.setdefault(sub, asyncio.Semaphore(self.engine.cap(sub)))
            task = self.engine.start(self.session, item, attempted_at, timestamp, wait, gate)
        self.in_flight[task] = (item, token, attempted_at, began)
        task.add_done_callback(self._on_done)

    def _on_done(self, task) -> None:
        self.done.append(task)
        self.wake.set()

    async def wait(self, timeout: float) -> None:
        if self.done or (self.claiming is not None and self.claiming.done()):
            return
        self.wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout)

    def collect(self) -> None:
        """Move finished requests to the record batch and give their subscriptions' turns to waiting work."""
        done, self.done = self.done, []
        freed = False
        for task in done:
            item, token, attempted_at, began = self.in_flight.pop(task)
            sub = item.subscription_id
            if item.turn is None:
                self.per_subscription[sub] -= 1
                self.started_at[sub].remove(began)
                self.slots -= 1
                held = self.team_slots[item.team_id] - 1
                if held:
                    self.team_slots[item.team_id] = held
                else:
                    del self.team_slots[item.team_id]
                freed = True
            try:
                result = task.result()  # http.post does not raise; this is the belt to its braces
            except Exception as exc:  # noqa: BLE001
                log.error("attempt of delivery %s raised %r", item.delivery_id, exc)
                result = http.AttemptResult(Outcome(error=http.error_text("internal error", exc)), 0, None)
            self.engine.learn(sub, result.duration_ms / 1000)
            if not self.finished:
                self.first_finished_at = time.monotonic()
            self.finished.append((item, token, attempted_at, result))
        # Who wants slots changes as work arrives and ends: waiting work may start on a freed slot, or
        # on a share that grew.
        if (self.refresh() or freed) and self.waiting_total:
            self.dispatch()

    async def settle(self, final: bool) -> None:
        """Hand back what waits beyond its subscription's share (or everything, at the end of the budget)."""
        if not self.waiting_total:
            return
        engine = self.engine
        to_defer, expected = [], {}
        for sub, queue in list(self.waiting.items()):
            starts = self.started_at.get(sub)
            expected[sub] = engine.expected_seconds(sub, min(starts) if starts else None)
            keep = 0 if final else engine.waiting_cap(expected[sub])
            while len(queue) > keep:
                item, token = queue.pop()
                self._unwait(item)
                to_defer.append((item, token))
        if to_defer:
            self.waiting_total -= len(to_defer)
            self.stats.deferred += len(to_defer)
            await asyncio.to_thread(engine.defer_paced, to_defer, expected)

    async def flush(self, wait: bool = False) -> None:
        """Record finished attempts in a worker thread while requests go on; one batch at a time."""
        pending = self.recording
        if pending is not None:
            if not pending.done() and not wait and len(self.finished) < 2 * RECORD_BATCH:
                return  # keep collecting; the next batch goes when this one is written
            await pending  # raises what the write raised: a failed write fails the drain (abandon retries it)
            self.recording, self.recording_batch = None, []
        if self.finished:
            finished, self.finished = self.finished, []
            self.stats.records += 1
            self.recording_batch = finished
            self.recording = asyncio.ensure_future(asyncio.to_thread(self.engine.record, finished, self.stats))
            if wait:
                await self.recording
                self.recording, self.recording_batch = None, []

    def renew_leases(self) -> None:
        """Renew, in a thread, the leases of everything this drain holds; a failed renewal only lets
        those leases run out (waiting work is then not started: see collect)."""
        if self.renewing is not None and not self.renewing.done():
            return
        held: dict[str, list[str]] = {}
        for item, token, *_ in (*self.in_flight.values(), *self.finished, *self.recording_batch):
            held.setdefault(token, []).append(item.delivery_id)
        for queue in self.waiting.values():
            for item, token in queue:
                held.setdefault(token, []).append(item.delivery_id)
        if not held:
            return
        engine = self.engine
        renewed_at = time.monotonic()

        def renewed(future: asyncio.Future) -> None:
            if future.exception() is not None:
                log.warning("renewing %d leases failed: %s", sum(map(len, held.values())), future.exception())
                return
            for token in held:
                self.lease_deadlines[token] = renewed_at + engine.lease_seconds * LEASE_SAFETY

        self.renewing = asyncio.ensure_future(asyncio.to_thread(engine.renew, held))
        self.renewing.add_done_callback(renewed)

    async def abandon(self) -> None:
        """The drain failed. First give back what was claimed but not sent (due at once, for any
        worker), then wait for the requests already on the wire and record every finished attempt:
        a receiver that got the POST must not get it again for want of its attempt row."""
        engine = self.engine
        unsent = [(item, token) for queue in self.waiting.values() for item, token in queue]
        self.waiting.clear()
        self.team_waiting.clear()
        self.team_waiting_subs.clear()
        self.waiting_total = 0
        if self.claiming is not None:
            with contextlib.suppress(Exception):  # a claim that failed leased nothing
                items, token = await self.claiming
                unsent += [(item, token) for item in items]
            self.claiming, self.claiming_ids = None, []
        try:
            await asyncio.to_thread(engine.through_outage, engine.release, unsent)
        except Exception:  # noqa: BLE001 - nothing more to do: their leases run out
            log.exception("could not release %d unsent deliveries; their leases run out in %s s",
                          len(unsent), engine.lease_seconds)
        if self.in_flight:
            # Each request ends by its own timeout (at most the longest attempt timeout).
            longest = max(item.attempt_timeout for item, *_ in self.in_flight.values())
            await asyncio.wait(list(self.in_flight), timeout=longest + 1)
            for task in self.in_flight:
                if not task.done():
                    task.cancel()  # cannot happen within its timeout; do not leave it behind
        self.done = [task for task in self.in_flight if task.done() and not task.cancelled()]
        self.collect()
        batches = [self.finished]
        self.finished = []
        if self.recording is not None:
            try:
                await self.recording
            except Exception:  # noqa: BLE001 - written again below, unless it committed after all
                batches.append(self.recording_batch)
            self.recording, self.recording_batch = None, []
        for batch in batches:
            if not batch:
                continue
            try:
                await asyncio.to_thread(engine.through_outage, engine.record, batch, self.stats)
            except Exception:  # noqa: BLE001
                log.exception("could not record %d attempts already sent; they will be sent again after their "
                              "leases (%s s)", len(batch), engine.lease_seconds)
