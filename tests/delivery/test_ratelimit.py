"""Per-endpoint rate limits across all workers (GCRA in Redis) and in-flight caps per subscription.

A throttled delivery waits its turn: not an attempt, not a failure, not counted in the retry schedule,
and nothing is lost if its worker dies while it waits. Time is the injected clock throughout."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from sqlalchemy import func, select

from dashboard.core.clock import unix
from dashboard.delivery.engine import DeliveryEngine
from dashboard.delivery.ratelimit import TOLERANCE_SECONDS, RateLimiter
from dashboard.core.extensions import db
from dashboard.models import Attempt, Delivery
from dashboard.queue.work import WorkQueue
from dashboard.operations.sweeper import sweep_once

from tests.support.pipeline import deliver_due

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@sqlite_only
@pytest.mark.parametrize("rate", [7, 100, 400])
def test_two_workers_sharing_redis_never_pass_more_than_the_rate(app, rate):
    """Two limiters (two workers) ask in turn, every millisecond of a simulated 3 s, for more than
    they may send: together they get the rate, in every second, and no more than its burst."""
    work = WorkQueue.for_app(app)
    prefix = app.config["PROMESA_REDIS_PREFIX"]
    workers = [RateLimiter(work.conn, prefix), RateLimiter(work.conn, prefix)]
    start = 1_800_000_000.0
    per_second: Counter = Counter()
    for ms in range(3000):
        now = start + ms / 1000
        admitted, _, _ = workers[ms % 2].admit({"sub_x": (rate, 5)}, now)["sub_x"]
        per_second[ms // 1000] += admitted
    burst = int(rate * TOLERANCE_SECONDS) + 1
    assert per_second[0] <= rate + burst
    for second in (1, 2):  # steady state: the rate exactly (to one delivery)
        assert rate - 1 <= per_second[second] <= rate + 1, per_second


@sqlite_only
def test_the_limiter_loads_its_script_again_when_redis_lost_it(app):
    """A Redis restarted or flushed has no scripts: the limiter's first call after it still answers, and
    (one pipeline, no SCRIPT EXISTS before each call) a normal call is a single round trip."""
    work = WorkQueue.for_app(app)
    limiter = RateLimiter(work.conn, app.config["PROMESA_REDIS_PREFIX"])
    now = 1_800_000_000.0
    assert limiter.admit({"sub_a": (10, 1), "sub_b": (10, 1)}, now)["sub_a"][0] == 1
    work.conn.script_flush()
    assert limiter.admit({"sub_a": (10, 1), "sub_b": (10, 1)}, now + 1)["sub_b"][0] == 1
    calls_before = work.conn.info("commandstats").get("cmdstat_script|exists", {}).get("calls", 0)
    limiter.admit({"sub_a": (10, 1)}, now + 2)
    assert work.conn.info("commandstats").get("cmdstat_script|exists", {}).get("calls", 0) == calls_before


@pytest.fixture
def stepwise(app):
    """Turns handed out only for now, none reserved ahead: each drain sends what the clock allows."""
    app.config["PROMESA_RATE_LIMIT_LOOKAHEAD_SECONDS"] = 0.0


def drain_once(app, clock, engine=None) -> None:
    work = WorkQueue.for_app(app)
    work.promote_due(unix(clock.now()))
    (engine or DeliveryEngine(app, work, clock)).drain(None, 20)


def waiting_rows(sub_id):
    return db.session.execute(select(Delivery.state, Delivery.attempt_count, Delivery.last_error)
                              .where(Delivery.subscription_id == sub_id, Delivery.state != "succeeded")).all()


@pytest.mark.parametrize("same_engine", [False, True], ids=["a-fresh-worker", "a-worker-that-knows-the-limit"])
def test_a_throttled_delivery_waits_its_turn_and_is_not_an_attempt(app, producer, receiver, clock, same_engine, stepwise):
    sub = producer.subscribe(receiver.url + "/ok", rate_limit_per_s=2)  # one delivery every 0.5 s
    for _ in range(5):
        producer.publish()
    engine = DeliveryEngine(app, WorkQueue.for_app(app), clock) if same_engine else None
    drain_once(app, clock, engine)
    assert receiver.count() == 1
    if engine is not None:  # it now throttles before claiming: the waiting work never touches the database
        assert engine.pacing.rate_limits == {sub["id"]: 2.0}
    db.session.expire_all()
    assert sorted(waiting_rows(sub["id"])) == [("pending", 0, None)] * 4  # no attempt, no failure
    assert db.session.scalar(select(func.count()).select_from(Attempt)) == 1
    arrivals = [receiver.count()]
    for _ in range(5):
        clock.advance(seconds=0.5)
        drain_once(app, clock, engine)
        arrivals.append(receiver.count())
    assert arrivals == [1, 2, 3, 4, 5, 5]  # one per half second, by the clock
    assert db.session.scalar(select(func.count()).select_from(Attempt)) == 5
    assert sorted(r.path for r in receiver.requests) == ["/ok"] * 5


@sqlite_only
def test_nothing_is_lost_when_redis_forgets_a_throttled_delivery(app, producer, receiver, clock, stepwise):
    sub = producer.subscribe(receiver.url + "/ok", rate_limit_per_s=1)
    for _ in range(3):
        producer.publish()
    drain_once(app, clock)
    assert receiver.count() == 1
    work = WorkQueue.for_app(app)
    work.conn.delete(work.scheduled_key)
    work.drop_ready()  # the worker that handed them back died, Redis lost them
    clock.advance(seconds=1)
    assert sweep_once(app) == 2  # the rows stayed due in the database
    for _ in range(3):
        drain_once(app, clock)
        clock.advance(seconds=1)
    assert receiver.count() == 3
    assert len({r.headers["X-Event-Id"] for r in receiver.requests}) == 3
    assert waiting_rows(sub["id"]) == []


@sqlite_only
def test_a_replay_obeys_the_limit(app, producer, receiver, clock, stepwise):
    sub = producer.subscribe(receiver.url + "/status/400")
    for _ in range(4):
        producer.publish()
    for _ in range(3):  # 4xx: three attempts, then dead
        deliver_due(app, clock)
        clock.advance(hours=1)
    assert producer.get(f"/api/v1/subscriptions/{sub['id']}/deliveries?state=dead").get_json()["data"]
    producer.client.patch(f"/api/v1/subscriptions/{sub['id']}", headers=producer.headers(),
                          json={"url": receiver.url + "/ok", "rate_limit_per_s": 1})
    assert producer.post(f"/api/v1/subscriptions/{sub['id']}/replay").get_json() == {"replayed": 4}
    counts = []
    for _ in range(4):
        drain_once(app, clock)
        counts.append(receiver.count("/ok"))
        clock.advance(seconds=1)
    assert counts == [1, 2, 3, 4]


@sqlite_only
def test_an_endpoint_without_a_limit_never_asks_redis_for_one(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/ok")
    for _ in range(20):
        producer.publish()
    drain_once(app, clock)
    assert receiver.count() == 20
    work = WorkQueue.for_app(app)
    assert not list(work.conn.scan_iter(match=f"{app.config['PROMESA_REDIS_PREFIX']}:rate:*"))
    assert sub["rate_limit_per_s"] is None


@sqlite_only
def test_max_in_flight_caps_requests_to_one_endpoint(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/slow/0.3", max_in_flight=1)
    for _ in range(3):
        producer.publish()
    drain_once(app, clock)
    arrivals = sorted(r.at for r in receiver.requests)
    assert len(arrivals) == 3
    assert all(later - earlier >= 0.29 for earlier, later in zip(arrivals, arrivals[1:]))  # one at a time


@sqlite_only
def test_looking_takes_no_turn(app):
    limiter = RateLimiter(WorkQueue.for_app(app).conn, app.config["PROMESA_REDIS_PREFIX"])
    now = 1_800_000_000.0
    looks = [limiter.admit({"sub_y": (10, 5)}, now, consume=False)["sub_y"] for _ in range(3)]
    next_at = pytest.approx(now + 0.1 - TOLERANCE_SECONDS)
    assert looks == [(1, now, next_at)] * 3  # a worker deciding what to claim does not use the turn up
    assert limiter.admit({"sub_y": (10, 5)}, now)["sub_y"] == (1, now, next_at)  # taking it, before sending
    admitted, _, _ = limiter.admit({"sub_y": (10, 5)}, now, consume=False)["sub_y"]
    assert admitted == 0


@sqlite_only
def test_turns_a_moment_ahead_are_reserved_and_waited_for_by_the_worker(app, producer, receiver, clock):
    """With a lookahead, the worker takes the next turns (one interval apart) and sends each at its own:
    the endpoint gets them spaced by the rate, without the promoter's tick in between."""
    app.config["PROMESA_RATE_LIMIT_LOOKAHEAD_SECONDS"] = 0.5
    limiter = RateLimiter(WorkQueue.for_app(app).conn, app.config["PROMESA_REDIS_PREFIX"], lookahead=0.5)
    admitted, first, _ = limiter.admit({"sub_z": (10, 20)}, 1_800_000_000.0)["sub_z"]
    assert admitted == 6 and first == 1_800_000_000.0  # turns 0, 0.1, ... 0.5 s ahead: within 0.5 s + 50 ms

    producer.subscribe(receiver.url + "/ok", rate_limit_per_s=20)
    for _ in range(5):
        producer.publish()
    began = time.time()
    drain_once(app, clock)  # the first claim: five turns, 50 ms apart, all within the lookahead
    arrivals = sorted(r.at for r in receiver.requests)
    assert len(arrivals) == 5
    # None goes before its turn: the i-th arrival comes at least i intervals after the drain began.
    assert all(at - began >= 0.05 * i - 0.002 for i, at in enumerate(arrivals)), [a - began for a in arrivals]
    stamps = sorted(int(r.headers["X-Signature"].split(",")[0][2:]) for r in receiver.requests)
    assert stamps[-1] - stamps[0] <= 1  # signed at their turns, by the injected clock


def test_a_request_that_missed_its_turn_takes_a_fresh_one_instead_of_going_at_once():
    import asyncio

    from dashboard.delivery.ratelimit import at_turn

    asked = []

    def retake():
        asked.append(time.monotonic())
        return True, 0.02  # a fresh turn, 20 ms away

    async def request():
        return time.monotonic()

    async def main():
        gate = asyncio.Semaphore(1)
        on_time = await at_turn(0.01, request(), retake, gate)
        assert not asked  # on time: no second question
        began = time.monotonic()
        sent = await at_turn(-0.2, request(), retake, gate)  # its turn went by 200 ms ago (a stalled loop)
        assert len(asked) == 1 and sent - began >= 0.02  # it waited for the fresh turn
        return on_time

    asyncio.run(main())
