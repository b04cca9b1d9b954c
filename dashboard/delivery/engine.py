"""The drain loop: take ready delivery ids from Redis, claim them in the database, POST them
with many requests in flight, record every attempt in bulk, and schedule what must be retried.

The database decides who may attempt what: a delivery is claimed by a conditional UPDATE
(due, not leased), so two workers can never both send it, and a stale or duplicated id in
Redis is simply skipped.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
from sqlalchemy import and_, bindparam, or_, select, update

from .. import crypto
from ..clock import unix
from ..models import Attempt, Delivery, DeliveryState, Event, Subscription, SubscriptionState
from . import http
from .policies import decide, policy_for
from .targets import PublicOnlyResolver

log = logging.getLogger(__name__)

D = Delivery.__table__
E = Event.__table__
S = Subscription.__table__
A = Attempt.__table__

POP_BATCH = 200
# A delivery whose subscription already has its share of requests in flight waits this long.
SATURATED_RETRY_SECONDS = 1.0


@dataclass
class Claimed:
    delivery_id: str
    attempt_number: int
    attempts_in_schedule: int  # this attempt's place in the retry schedule (restarts on replay)
    event_id: str
    event_type: str
    event_created_at: dt.datetime
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


@dataclass
class DrainStats:
    claimed: int = 0
    attempted: int = 0
    succeeded: int = 0
    held: int = 0
    deferred: int = 0
    skipped: int = 0
    states: Counter = field(default_factory=Counter)


class DeliveryEngine:
    def __init__(self, app, work, clock, rng: random.Random | None = None):
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

    # -- database ------------------------------------------------------------------
    def claim(self, ids: list[str]) -> tuple[list[Claimed], str | None]:
        """Lease the given deliveries that are due and free; return them with what sending needs."""
        if not ids:
            return [], None
        now = self.clock.now()
        token = str(uuid.uuid4())
        with self.db_engine.begin() as conn:
            claimed = conn.execute(
                update(D)
                .where(D.c.id.in_(ids), D.c.state.in_(DeliveryState.DUE), D.c.next_attempt_at <= now,
                       or_(D.c.lease_expires_at.is_(None), D.c.lease_expires_at < now))
                .values(lease_token=token, lease_expires_at=now + dt.timedelta(seconds=self.lease_seconds))
                .returning(D.c.id)
            ).scalars().all()
            if not claimed:
                return [], None
            rows = conn.execute(
                select(D.c.id, D.c.attempt_count, D.c.retry_base, E.c.id.label("event_id"), E.c.type, E.c.created_at, E.c.body,
                       S.c.id.label("subscription_id"), S.c.state, S.c.url, S.c.secret_ciphertext,
                       S.c.signature_scheme, S.c.retry_policy, S.c.max_age_seconds, S.c.connect_timeout,
                       S.c.attempt_timeout)
                .select_from(D.join(E, D.c.event_id == E.c.id).join(S, D.c.subscription_id == S.c.id))
                .where(D.c.lease_token == token)
            ).all()
        return [Claimed(r.id, r.attempt_count + 1, r.attempt_count + 1 - r.retry_base, r.event_id, r.type, r.created_at, r.body.encode("utf-8"),
                        r.subscription_id, r.state, r.url, r.secret_ciphertext, r.signature_scheme,
                        r.retry_policy, r.max_age_seconds, r.connect_timeout, r.attempt_timeout)
                for r in rows], token

    def hold(self, items: list[Claimed], token: str) -> None:
        """The subscription is paused or disabled: keep the delivery, do not attempt it."""
        self._set_state_without_attempt(items, token, DeliveryState.HELD, None)

    def defer(self, items: list[Claimed], token: str, seconds: float) -> None:
        """Not attempted (its subscription is saturated here): due again shortly, no attempt counted."""
        when = self.clock.now() + dt.timedelta(seconds=seconds)
        self._set_state_without_attempt(items, token, None, when)
        self.work.schedule([(i.delivery_id, unix(when)) for i in items])

    def _set_state_without_attempt(self, items, token, state, next_attempt_at) -> None:
        if not items:
            return
        values = {"lease_token": None, "lease_expires_at": None, "updated_at": self.clock.now()}
        if state:
            values["state"] = state
        if next_attempt_at:
            values["next_attempt_at"] = next_attempt_at
        with self.db_engine.begin() as conn:
            conn.execute(update(D).where(D.c.id.in_([i.delivery_id for i in items]), D.c.lease_token == token)
                         .values(**values))

    def record(self, finished: list[tuple[Claimed, str, dt.datetime, http.AttemptResult]], stats: DrainStats) -> None:
        """Write the attempts and the next state of every delivery in one transaction, then schedule retries."""
        if not finished:
            return
        now = self.clock.now()
        attempts, updates, to_disable, to_schedule = [], [], {}, []
        for item, token, attempted_at, result in finished:
            outcome = result.outcome
            attempts.append({"delivery_id": item.delivery_id, "number": item.attempt_number,
                             "attempted_at": attempted_at, "duration_ms": result.duration_ms,
                             "status_code": outcome.status_code, "error": outcome.error,
                             "response_excerpt": result.response_excerpt})
            policy = policy_for(item.retry_policy, item.max_age_seconds)
            decision = decide(policy, outcome, item.attempts_in_schedule, item.event_created_at, now, self.rng)
            updates.append({
                "b_id": item.delivery_id, "b_token": token, "state": decision.state,
                "attempt_count": item.attempt_number, "next_attempt_at": decision.next_attempt_at,
                "last_status_code": outcome.status_code, "last_error": outcome.error, "updated_at": now,
                "succeeded_at": now if decision.state == DeliveryState.SUCCEEDED else None,
                "dead_lettered_at": now if decision.state == DeliveryState.DEAD else None,
            })
            if decision.disable_subscription:
                to_disable[item.subscription_id] = decision.disable_subscription
            if decision.state == DeliveryState.SCHEDULED:
                to_schedule.append((item.delivery_id, unix(decision.next_attempt_at)))
            stats.attempted += 1
            stats.states[decision.state] += 1
        with self.db_engine.begin() as conn:
            conn.execute(A.insert(), attempts)
            conn.execute(
                update(D).where(and_(D.c.id == bindparam("b_id"), D.c.lease_token == bindparam("b_token")))
                .values(state=bindparam("state"), attempt_count=bindparam("attempt_count"),
                        next_attempt_at=bindparam("next_attempt_at"), last_status_code=bindparam("last_status_code"),
                        last_error=bindparam("last_error"), updated_at=bindparam("updated_at"),
                        succeeded_at=bindparam("succeeded_at"), dead_lettered_at=bindparam("dead_lettered_at"),
                        lease_token=None, lease_expires_at=None),
                updates)
            for subscription_id, reason in to_disable.items():
                conn.execute(update(S).where(S.c.id == subscription_id, S.c.state == SubscriptionState.ACTIVE)
                             .values(state=SubscriptionState.DISABLED, state_reason=reason, updated_at=now))
        # After the commit: a crash here only delays the retry until the sweeper finds it.
        self.work.schedule(to_schedule)

    def _secret(self, item: Claimed) -> str:
        secret = self._secrets.get(item.secret_ciphertext)
        if secret is None:
            with self.app.app_context():
                secret = self._secrets[item.secret_ciphertext] = crypto.decrypt(item.secret_ciphertext)
        return secret

    # -- the loop -------------------------------------------------------------------
    def drain(self, slot_token: str | None = None, budget_seconds: float = 30.0) -> DrainStats:
        return asyncio.run(self._drain(slot_token, budget_seconds))

    async def _drain(self, slot_token, budget_seconds) -> DrainStats:
        stats = DrainStats()
        deadline = time.monotonic() + budget_seconds
        next_heartbeat = time.monotonic() + 10
        in_flight: dict[asyncio.Task, tuple[Claimed, str, dt.datetime]] = {}
        per_subscription: Counter = Counter()
        finished: list = []
        connector = aiohttp.TCPConnector(limit=self.max_in_flight, limit_per_host=0,
                                         resolver=None if self.allow_private else PublicOnlyResolver())
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
            exhausted = False
            while True:
                room = self.max_in_flight - len(in_flight)
                popped = 0
                if room > 0 and not exhausted and time.monotonic() < deadline:
                    ids = self.work.pop_ready(min(room, POP_BATCH))
                    popped = len(ids)
                    exhausted = popped == 0
                    if ids:
                        self._start(session, ids, in_flight, per_subscription, stats)
                if not in_flight:
                    self.record(finished, stats)
                    finished.clear()
                    if exhausted or time.monotonic() >= deadline:
                        break
                    continue
                done, _ = await asyncio.wait(in_flight, timeout=0 if popped else 0.05,
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    item, token, attempted_at = in_flight.pop(task)
                    per_subscription[item.subscription_id] -= 1
                    finished.append((item, token, attempted_at, task.result()))
                # Record in bulk: many rows per transaction, but never sit on results for long.
                if finished and (len(finished) >= 100 or not popped):
                    self.record(finished, stats)
                    finished.clear()
                if exhausted and in_flight:
                    exhausted = False  # look again for work that arrived while these were in flight
                    await asyncio.sleep(0)
                if slot_token and time.monotonic() > next_heartbeat:
                    self.work.heartbeat(slot_token)
                    next_heartbeat = time.monotonic() + 10
        stats.succeeded = stats.states[DeliveryState.SUCCEEDED]
        return stats

    def _start(self, session, ids, in_flight, per_subscription, stats) -> None:
        items, token = self.claim(ids)
        stats.claimed += len(items)
        stats.skipped += len(ids) - len(items)
        to_hold, to_defer = [], []
        for item in items:
            if item.subscription_state != SubscriptionState.ACTIVE:
                to_hold.append(item)
            elif per_subscription[item.subscription_id] >= self.per_subscription:
                to_defer.append(item)
            else:
                per_subscription[item.subscription_id] += 1
                attempted_at = self.clock.now()
                headers = http.delivery_headers(
                    event_id=item.event_id, event_type=item.event_type, delivery_id=item.delivery_id,
                    attempt_number=item.attempt_number, scheme=item.scheme, secrets=[self._secret(item)],
                    timestamp=int(unix(attempted_at)), body=item.body)
                task = asyncio.ensure_future(http.post(
                    session, item.url, item.body, headers, connect_timeout=item.connect_timeout,
                    attempt_timeout=item.attempt_timeout, excerpt_bytes=self.excerpt_bytes,
                    allow_private=self.allow_private))
                in_flight[task] = (item, token, attempted_at)
        self.hold(to_hold, token)
        self.defer(to_defer, token, SATURATED_RETRY_SECONDS)
        stats.held += len(to_hold)
        stats.deferred += len(to_defer)
