"""The ledger of deliveries in the database: the claim, and everything a drain writes under the leases it
took (hold, release, hand back, renew, and the record of finished attempts).

The database decides who may attempt what: a delivery is claimed by a conditional UPDATE
(due, not leased), so two workers can never both send it, and a stale or duplicated id in
Redis is simply skipped. Each write is safe to run again after a lost connection, and
`through_outage` waits out a database that is away for what a failed drain still owes.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

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

from dashboard.core.clock import from_unix, unix
from dashboard.core.outages import REDIS_AWAY, database_outage, database_unavailable, retry_on_lost_connection
from dashboard.delivery import failures, http
from dashboard.delivery.policies import Decision, Outcome, decide, policy_for
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
)
from dashboard.queue.work import work_item
from dashboard.stats import outcomes

log = logging.getLogger(__name__)

DELIVERIES = Delivery.__table__
EVENTS = Event.__table__
SUBSCRIPTIONS = Subscription.__table__
CONSUMERS = Consumer.__table__
ATTEMPTS = Attempt.__table__

# A failed drain waits this long for the database to record what it sent (well inside the drain job's timeout).
OUTAGE_WAIT_SECONDS = 120.0


class AttemptRow(NamedTuple):
    """One attempts row, in the order COPY writes its columns."""
    delivery_id: str
    number: int
    attempted_at: dt.datetime
    duration_ms: int
    status_code: int | None
    error: str | None
    response_excerpt: str | None
    response_headers: str | None


_ATTEMPT_COLUMNS = AttemptRow._fields
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
# execution (with its casts). Pull delivery's statements use it too.
DUE_STATE = or_(*(DELIVERIES.c.state == state for state in DeliveryState.DUE))


def _claim(array: bool):
    return (
        update(DELIVERIES)
        .where(_by_ids(array),
               and_(DUE_STATE, DELIVERIES.c.next_attempt_at <= bindparam("now"),
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
    team_id: str  # the tenant whose share of the in-flight slots it takes (see fair_shares.FairShares.may_start)
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


class Finished(NamedTuple):
    """An attempt that has ended, waiting to be recorded: the delivery, the lease it was sent under, when."""
    item: Claimed
    token: str
    attempted_at: dt.datetime
    result: http.AttemptResult


class _Decided(NamedTuple):
    """A finished attempt, and what follows from it: its next state and its attempt row."""
    item: Claimed
    token: str
    attempted_at: dt.datetime
    result: http.AttemptResult
    outcome: Outcome
    decision: Decision
    attempt: AttemptRow


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



class Ledger:
    """What a drain reads and writes in the database, by lease token."""

    def __init__(self, db_engine, work, clock, rng: random.Random, lease_seconds: float):
        self.db_engine = db_engine
        self.work = work
        self.clock = clock
        self.rng = rng
        self.lease_seconds = lease_seconds

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

    def hand_back(self, by_token: dict[str, list[str]], due_unix: float, now: dt.datetime,
                  retry: bool = True) -> None:
        """Free claimed deliveries ({lease token: delivery ids}) unsent, due again at `due_unix` (the
        earliest of the times Redis holds for them: claimable from then on, and the sweeper leaves them
        alone while Redis holds them). `retry`: run again after a lost connection."""
        def write():
            with self.db_engine.begin() as conn:
                for token, ids in by_token.items():
                    conn.execute(update(DELIVERIES).where(DELIVERIES.c.id.in_(ids), DELIVERIES.c.lease_token == token)
                                 .values(next_attempt_at=from_unix(due_unix), updated_at=now,
                                         lease_token=None, lease_expires_at=None))

        if retry:
            retry_on_lost_connection(write, "handing back deliveries")
        else:
            write()

    def record(self, finished: list[Finished], stats: DrainStats) -> None:
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
            attempt = AttemptRow(item.delivery_id, item.attempt_number, attempted_at, result.duration_ms,
                                 outcome.status_code, outcome.error, result.response_excerpt, result.response_headers)
            try:
                decision = decide(policy_for(item.retry_policy, item.max_age_seconds), outcome,
                                  item.attempts_in_schedule, item.schedule_started_at, now, self.rng)
            except Exception as exc:  # noqa: BLE001 - a bug in one decision is that attempt's error, not the batch's
                outcome, decision = self._fallback_decision(item, exc, now)
                attempt = attempt._replace(error=outcome.error)
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
        outcome = Outcome(error=failures.error_text(failures.INTERNAL_ERROR, exc))
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

    def _insert_attempts(self, conn, rows: list[AttemptRow]) -> None:
        """Attempt rows in bulk: COPY on PostgreSQL (far less CPU than executemany), executemany elsewhere."""
        if conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg":
            cursor = conn.connection.dbapi_connection.cursor()
            with cursor.copy(_COPY_ATTEMPTS) as copy:
                for row in rows:
                    copy.write_row(row)
            return
        conn.execute(ATTEMPTS.insert(), [row._asdict() for row in rows])

