"""Drain slots: while one drain beats, a trickle of work starts no second drain (two would split it and
each claim, send and record half as much at a time); a backlog, or a drain that stopped beating (its
worker was killed), starts another; a spare drain that finds only a trickle ends."""

from __future__ import annotations

import json
import threading
import time

from dashboard.delivery.engine import DeliveryEngine
from dashboard.queue.work import (
    SLOT_STALE_SECONDS,
    SLOT_TTL_SECONDS,
    SPARE_DRAIN_BACKLOG,
    WorkQueue,
    is_spare,
    work_item,
)
from tests.support.waiting import wait_until


def queue(app, max_drainers: int = 4) -> WorkQueue:
    work = WorkQueue.for_app(app)
    work.max_drainers = max_drainers
    return work


def slots(work: WorkQueue) -> list[str]:
    return [t.decode() for t in work.conn.zrange(work.drainers_key, 0, -1)]


def beat_ago(work: WorkQueue, token: str, seconds: float) -> None:
    """A slot whose drain last beat `seconds` ago (no test waits for a heartbeat to age)."""
    work.conn.zadd(work.drainers_key, {token: time.time() + SLOT_TTL_SECONDS - seconds})


def items(n: int, start: int = 0) -> list[str]:
    return [work_item("sub_1", f"dlv_{i}") for i in range(start, start + n)]


def test_the_first_push_starts_a_drain_and_a_trickle_after_it_starts_none(app):
    work = queue(app)
    assert work.push(items(1)) is True
    assert len(slots(work)) == 1
    for n in range(1, 20):  # the running drain beats: it takes these
        assert work.push(items(1, n)) is False
    assert len(slots(work)) == 1


def test_a_backlog_beyond_one_drains_take_starts_another(app):
    work = queue(app)
    work.push(items(1))
    assert work.push(items(SPARE_DRAIN_BACKLOG - 1, 1)) is False  # exactly what one drain pops at once
    assert work.push(items(1, SPARE_DRAIN_BACKLOG)) is True
    assert len(slots(work)) == 2


def test_a_drain_that_stopped_beating_does_not_hold_back_another(app):
    work = queue(app)
    beat_ago(work, "killed-mid-drain", SLOT_STALE_SECONDS - 1)
    assert work.push(items(1)) is False  # it beat a moment ago: it is draining
    beat_ago(work, "killed-mid-drain", SLOT_STALE_SECONDS + 1)
    assert work.push(items(1, 1)) is True  # silent too long: its worker is gone, another drain starts
    assert len(slots(work)) == 2  # its slot still counts against the cap until it expires


def test_the_cap_on_drains_holds_whatever_the_backlog(app):
    work = queue(app, max_drainers=2)
    beat_ago(work, "a", SLOT_STALE_SECONDS + 1)
    beat_ago(work, "b", SLOT_STALE_SECONDS + 1)
    assert work.push(items(SPARE_DRAIN_BACKLOG + 1)) is False
    assert sorted(slots(work)) == ["a", "b"]


def test_a_heartbeat_renews_the_slot_and_names_the_others_beating(app):
    work = queue(app)
    beat_ago(work, "mine", SLOT_STALE_SECONDS + 10)
    beat_ago(work, "fresh", 0.5)
    beat_ago(work, "stale", SLOT_STALE_SECONDS + 1)
    assert work.heartbeat("mine") == ["fresh"]
    assert work.conn.zscore(work.drainers_key, "mine") > time.time() + SLOT_TTL_SECONDS - 1
    assert is_spare("b", ["a"]) and not is_spare("a", ["b"]) and not is_spare("a", [])


def test_a_spare_drain_with_only_a_trickle_ends_at_its_heartbeat(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/ok")
    ids = [producer.publish("file.updated", {"n": n})["id"] for n in range(3)]
    work = WorkQueue.for_app(app)
    beat_ago(work, "0-the-first-drain", 0)  # another drain is beating, and comes first
    started = time.monotonic()
    stats = DeliveryEngine(app, work, clock).drain("z-a-spare", budget_seconds=20, linger_seconds=15)
    assert stats.spare_ended
    assert time.monotonic() - started < 10  # not its linger: the first drain takes the trickle
    assert sorted(json.loads(r.body)["id"] for r in receiver.requests) == sorted(ids)  # what it took, it sent


def test_the_first_drain_keeps_the_trickle(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/ok")
    producer.publish("file.updated", {"n": 1})
    work = WorkQueue.for_app(app)
    beat_ago(work, "z-a-spare", 0)
    stats = DeliveryEngine(app, work, clock).drain("0-the-first-drain", budget_seconds=20, linger_seconds=1.5)
    assert not stats.spare_ended  # it ended by lingering with nothing to do, as a lone drain does
    assert len(receiver.requests) == 1


def test_a_drain_past_its_grace_gives_its_slot_up_while_its_last_request_runs_out(app, producer, receiver, clock):
    """A request started in the grace (its endpoint not timed here yet) may outlive the grace's end: the
    drain then takes no more work, and must not keep the slot, or work arriving meanwhile waits for it."""
    producer.subscribe(receiver.url + "/slow/10", event_types=["first.sent"], connect_timeout=1, attempt_timeout=1)
    producer.subscribe(receiver.url + "/slow/10", event_types=["sent.in.the.grace"], connect_timeout=1,
                       attempt_timeout=5)
    producer.subscribe(receiver.url + "/ok", event_types=["arrives.after.it"])
    work = WorkQueue.for_app(app)
    producer.publish("first.sent")  # in flight at the budget's end: a grace until it has timed out (2 s)
    slot = slots(work)[0]
    drain = threading.Thread(target=DeliveryEngine(app, work, clock).drain, args=(slot, 0.2))
    drain.start()
    try:
        time.sleep(0.5)  # past the drain's budget (real time: the drain's, not the clock's)
        producer.publish("sent.in.the.grace")  # runs to its 5 s timeout, past the grace's longest end (3.8 s)
        assert wait_until(lambda: slot not in slots(work), timeout=8)
        assert drain.is_alive()  # still waiting for that request, and no longer holding back a successor
        producer.publish("arrives.after.it")
        assert len(slots(work)) == 1 and work.rq.count == 2  # its push started another drain
    finally:
        drain.join(10)
    assert not drain.is_alive() and receiver.count("/ok") == 0  # the successor's work, not this drain's
