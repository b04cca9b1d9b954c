"""The drain loop: take ready delivery ids from Redis, claim them in the database, POST them
with many requests in flight, record every attempt in bulk, and schedule what must be retried.

What it asks, and of whom: the database's claims and records are the ledger's (delivery.ledger),
how long an endpoint takes and what its limits let go are pacing's (delivery.pacing), and whether a
delivery may start now is the fair shares' (delivery.fair_shares).

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
from collections import Counter
from typing import NamedTuple

import aiohttp

from dashboard.core import crypto, tracing
from dashboard.core.clock import from_unix, unix
from dashboard.core.outages import REDIS_AWAY, database_outage, database_unavailable
from dashboard.delivery import failures, http, oauth, tls
from dashboard.delivery.fair_shares import FairShares
from dashboard.delivery.ledger import Claimed, DrainStats, Finished, Ledger
from dashboard.delivery.pacing import LOCAL_CAPACITY, Pacing
from dashboard.delivery.policies import Outcome
from dashboard.delivery.ratelimit import RateLimiter, at_turn
from dashboard.models import DeliveryState, SubscriptionState, previous_signs
from dashboard.queue.work import HEARTBEAT_SECONDS, is_spare, split_item

log = logging.getLogger(__name__)

POP_BATCH = 200
# A team whose whole share one slow subscription holds (FairShares.concentrated_teams) is popped this often,
# not at every turn of the loop: each pop hands the slow one's work back to Redis.
BESIDE_POP_SECONDS = 0.25

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
# Leases of what a drain holds (in flight, waiting, being recorded) are renewed this often, as a
# fraction of the lease: a lease can be short (a killed worker's work comes free soon) and still
# cover a delivery that waits behind a slow endpoint for longer than that.
LEASE_RENEW_FRACTION = 1 / 3


class InFlight(NamedTuple):
    """A request on the wire: the delivery, its lease, when it was signed for, and when it went (monotonic)."""
    item: Claimed
    token: str
    attempted_at: dt.datetime
    began: float


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
        self.ledger = Ledger(self.db_engine, work, clock, self.rng, self.lease_seconds)
        self.pacing = Pacing(clock, work, self.ledger, RateLimiter(work.conn, cfg["PROMESA_REDIS_PREFIX"],
                                                                   cfg["PROMESA_RATE_LIMIT_LOOKAHEAD_SECONDS"]),
                             self.max_in_flight, self.per_subscription)
        # Set from another thread (a worker asked to stop): the drain ends as at the end of its budget,
        # handing back what waits and recording what is in flight.
        self.stopping = threading.Event()


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
        shares = run.shares
        while True:
            now = time.monotonic()
            if self.stopping.is_set():
                deadline = closing_at = min(deadline, now)
            if closing_at is None and now >= deadline:
                closing_at = max([deadline, *(flight.began + flight.item.attempt_timeout + 1.0
                                              for flight in run.in_flight.values())])
                grace_ends_at = closing_at
                # What starts in the grace may carry it on while it is on the wire, once by as long again
                # at most: the drain serves until then instead of waiting idle for its last requests.
                latest_end = closing_at + (closing_at - deadline)
            if closing_at is not None and not self.stopping.is_set():
                closing_at = shares.closing_at = min(latest_end, max([grace_ends_at, *(
                    flight.began + flight.item.attempt_timeout + 1.0 for flight in run.in_flight.values())]))
            if now >= next_renewal:
                run.renew_leases()
                next_renewal = now + renew_every
            popped = 0
            if run.claiming is not None and run.claiming.done():
                await run.take_claimed()
            # Teams at their share here leave their work in Redis; the room they would have taken (and
            # as much again) stays open to the others, so that a newcomer is never behind them.
            least_share = shares.least_share()
            full = shares.full_teams() if shares.slots >= least_share or run.local >= LOCAL_CAPACITY * least_share \
                else ()
            room = min(POP_BATCH, LOCAL_CAPACITY * self.max_in_flight * (2 if full else 1) - run.local)
            # A team with work waiting here is refilled only once half the room is free: a claim of a few
            # deliveries costs the database nearly what a claim of a hundred does. Until then pops skip it,
            # and only it: one team's backlog here never keeps another team's work in Redis.
            skip = full
            if shares.waiting_total and room < min(POP_BATCH, LOCAL_CAPACITY * self.max_in_flight // 2):
                skip = {*full, *shares.team_waiting}
            # A full team whose share one slow subscription holds is popped now and then all the same: its other
            # subscriptions' work (another consumer's) starts beside it (may_start), the slow one's goes back (admit).
            beside = set()
            if now >= next_beside_pop:  # at most this often: it walks every subscription the drain has served
                shares.beside = shares.concentrated_teams() if full else set()
                beside = shares.beside & set(full)
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
            if not run.in_flight and not shares.waiting_total and not popped and run.claiming is None:
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
                        await run.take(ids, await asyncio.to_thread(self.ledger.claim, ids))
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
            sending = at_turn(wait, sending, functools.partial(self.pacing.retake, item), gate)
        return asyncio.get_running_loop().create_task(http.traced(span, sending))

    def now_for_starts(self) -> tuple[dt.datetime, int]:
        now = self.clock.now()
        return now, int(unix(now))



class _Drain:
    """The state of one drain: requests in flight, claimed deliveries waiting for their
    subscription's turn (kept by its fair shares), and finished attempts waiting to be recorded."""

    def __init__(self, engine: DeliveryEngine, session, stats: DrainStats):
        self.engine, self.session, self.stats = engine, session, stats
        self.ledger, self.pacing = engine.ledger, engine.pacing
        self.shares = FairShares(engine.max_in_flight, engine.pacing, engine.work, stats)
        self.in_flight: dict[asyncio.Task, InFlight] = {}
        # Per lease token: until when (monotonic) its waiting deliveries may still be started.
        self.lease_deadlines: dict[str, float] = {}
        self.renewing: asyncio.Future | None = None
        self.finished: list[Finished] = []
        self.first_finished_at = 0.0
        self.done: list[asyncio.Task] = []
        self.wake = asyncio.Event()
        self.recording: asyncio.Future | None = None
        self.recording_batch: list[Finished] = []  # what `recording` writes, kept until it is written
        # The claim under way in a thread, and its ids: while the database leases them, the loop keeps sending.
        self.claiming: asyncio.Future | None = None
        self.claiming_ids: list[str] = []
        # Per rate-limited subscription: its in-flight cap for requests that waited for their turn.
        self.turn_gates: dict[str, asyncio.Semaphore] = {}

    @property
    def local(self) -> int:
        return len(self.in_flight) + self.shares.waiting_total + len(self.claiming_ids)

    def dispatch(self) -> None:
        """Start waiting work that may start now: one delivery per subscription per pass, so that
        subscriptions (and, through may_start, teams) take free slots in turn."""
        shares = self.shares
        now = time.monotonic()
        starts_at = None
        progress = True
        while progress and shares.waiting_total:
            progress = False
            for queue in list(shares.waiting.values()):
                if not shares.may_start(queue[0].item):
                    continue
                item, token = shares.next_of(queue)
                progress = True
                if now < self.lease_deadlines[token]:
                    starts_at = starts_at or self.engine.now_for_starts()
                    self._send(item, token, starts_at)
                # else: the lease is too close to running out to start now; the sweeper hands it on.

    def start_claim(self, ids: list[str]) -> None:
        self.claiming_ids = ids
        self.claiming = asyncio.ensure_future(asyncio.to_thread(self.ledger.claim, ids))
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
        pacing, shares = self.pacing, self.shares
        for item in items:
            sub, delivery_id = split_item(item)
            if sub is not None:
                if sub not in expected:
                    expected[sub] = pacing.expected_seconds(sub, shares.oldest_start(sub))
                load = shares.per_subscription[sub] + len(shares.waiting.get(sub, ())) + admitted[sub]
                if load >= pacing.cap(sub) + pacing.waiting_cap(expected[sub]):
                    park.append((sub, delivery_id))
                    continue
                admitted[sub] += 1
                if sub in pacing.rate_limits:
                    limited.setdefault(sub, []).append(delivery_id)
                    continue
            claim.append(delivery_id)
        if park:
            self.stats.parked += len(park)
            await asyncio.to_thread(pacing.park, park, expected)
        if limited:  # the limiter hook: over the rate, work waits in Redis, unclaimed
            go, waiting = await asyncio.to_thread(pacing.throttle_unclaimed, limited)
            self.stats.throttled += waiting
            claim.extend(go)
        return claim

    async def take(self, ids: list[str], claimed: tuple[list[Claimed], str | None]) -> None:
        items, token = claimed
        stats, shares = self.stats, self.shares
        stats.claimed += len(items)
        stats.claims += 1
        stats.skipped += len(ids) - len(items)  # stale or duplicate ids: someone else has them, or they are done
        pulled = [item for item in items if item.url is None]
        if pulled:  # a pull subscription's (a stray work item): its own client fetches it, no worker sends it
            items = [item for item in items if item.url is not None]
            stats.skipped += len(pulled)
            await asyncio.to_thread(self.ledger.unlease, [(item, token) for item in pulled])
        self.pacing.learn_limits(items)
        if self.pacing.rate_limits:
            items = await self._throttle_claimed(items, token)
        to_hold = []
        if token is not None:
            self.lease_deadlines[token] = time.monotonic() + self.ledger.lease_seconds * LEASE_SAFETY
        now = self.engine.now_for_starts()
        # A claim's teams, and each team's subscriptions in it, share with each other from its first item on.
        subs_by_team: dict[str, set] = {}
        for item in items:
            subs_by_team.setdefault(item.team_id, set()).add(item.subscription_id)
        shares.refresh(frozenset(subs_by_team))
        shares.arriving_subs = {team: len(subs - shares.waiting.keys()) for team, subs in subs_by_team.items()}
        for item in items:
            if item.subscription_state != SubscriptionState.ACTIVE:
                to_hold.append(item)
            elif item.turn is not None or shares.may_start(item):
                self._send(item, token, now)
            else:
                shares.wait(item, token)
        shares.arriving_subs = {}
        if to_hold:
            await asyncio.to_thread(self.ledger.hold, to_hold, token)
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
        handed_back = await asyncio.to_thread(self.pacing.throttle_claimed, unchecked, token)
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
            self.shares.started(item, began)
        else:  # waiting for its turn takes no in-flight place: its gate admits the endpoint's cap at once
            gate = self.turn_gates.get(sub) or self.turn_gates.setdefault(sub, asyncio.Semaphore(self.pacing.cap(sub)))
            task = self.engine.start(self.session, item, attempted_at, timestamp, wait, gate)
        self.in_flight[task] = InFlight(item, token, attempted_at, began)
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
                self.shares.ended(item, began)
                freed = True
            try:
                result = task.result()  # http.post does not raise; this is the belt to its braces
            except Exception as exc:  # noqa: BLE001
                log.error("attempt of delivery %s raised %r", item.delivery_id, exc)
                result = http.AttemptResult(Outcome(error=failures.error_text(failures.INTERNAL_ERROR, exc)), 0, None)
            self.pacing.learn(sub, result.duration_ms / 1000)
            if not self.finished:
                self.first_finished_at = time.monotonic()
            self.finished.append(Finished(item, token, attempted_at, result))
        # Who wants slots changes as work arrives and ends: waiting work may start on a freed slot, or
        # on a share that grew.
        if (self.shares.refresh() or freed) and self.shares.waiting_total:
            self.dispatch()

    async def settle(self, final: bool) -> None:
        """Hand back what waits beyond its subscription's share (or everything, at the end of the budget)."""
        shares, pacing = self.shares, self.pacing
        if not shares.waiting_total:
            return
        to_defer, expected = [], {}
        for sub in list(shares.waiting):
            expected[sub] = pacing.expected_seconds(sub, shares.oldest_start(sub))
            to_defer += shares.trim(sub, 0 if final else pacing.waiting_cap(expected[sub]))
        if to_defer:
            self.stats.deferred += len(to_defer)
            await asyncio.to_thread(pacing.defer_paced, to_defer, expected)

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
            self.recording = asyncio.ensure_future(asyncio.to_thread(self.ledger.record, finished, self.stats))
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
        for queue in self.shares.waiting.values():
            for item, token in queue:
                held.setdefault(token, []).append(item.delivery_id)
        if not held:
            return
        ledger = self.ledger
        renewed_at = time.monotonic()

        def renewed(future: asyncio.Future) -> None:
            if future.exception() is not None:
                log.warning("renewing %d leases failed: %s", sum(map(len, held.values())), future.exception())
                return
            for token in held:
                self.lease_deadlines[token] = renewed_at + ledger.lease_seconds * LEASE_SAFETY

        self.renewing = asyncio.ensure_future(asyncio.to_thread(ledger.renew, held))
        self.renewing.add_done_callback(renewed)

    async def abandon(self) -> None:
        """The drain failed. First give back what was claimed but not sent (due at once, for any
        worker), then wait for the requests already on the wire and record every finished attempt:
        a receiver that got the POST must not get it again for want of its attempt row."""
        ledger = self.ledger
        unsent = self.shares.drop_waiting()
        if self.claiming is not None:
            with contextlib.suppress(Exception):  # a claim that failed leased nothing
                items, token = await self.claiming
                unsent += [(item, token) for item in items]
            self.claiming, self.claiming_ids = None, []
        try:
            await asyncio.to_thread(ledger.through_outage, ledger.release, unsent)
        except Exception:  # noqa: BLE001 - nothing more to do: their leases run out
            log.exception("could not release %d unsent deliveries; their leases run out in %s s",
                          len(unsent), ledger.lease_seconds)
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
                await asyncio.to_thread(ledger.through_outage, ledger.record, batch, self.stats)
            except Exception:  # noqa: BLE001
                log.exception("could not record %d attempts already sent; they will be sent again after their "
                              "leases (%s s)", len(batch), ledger.lease_seconds)
