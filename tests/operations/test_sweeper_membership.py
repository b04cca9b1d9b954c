"""The sweeper asks Redis only about the due deliveries it found: the ready list's index stays in step."""

from __future__ import annotations

from dashboard.core.clock import unix
from dashboard.queue.work import WorkQueue
from dashboard.operations.sweeper import sweep_once


def test_the_index_follows_every_push_and_pop(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/ok")
    for _ in range(5):
        producer.publish()
    work = WorkQueue.for_app(app)
    ready = work.ready_items()
    assert len(ready) == 5 and work.queued_among(ready) == set(ready)

    taken = work.pop_ready(2) + work.wait_ready(10, 1)
    assert sorted(taken) == sorted(ready)
    assert work.queued_among(ready) == set() and work.conn.zcard(work.ready_index_key) == 0

    work.schedule([(taken[0], unix(clock.now()) - 1)])
    assert work.queued_among(ready) == {taken[0]}
    assert work.promote_due(unix(clock.now())) == 1
    assert work.queued_among(ready) == {taken[0]}  # promoted: ready again, and indexed
    assert work.pop_ready(10) == [taken[0]] and work.queued_among(ready) == set()


def test_it_enqueues_only_due_work_that_redis_lost(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/ok")
    for _ in range(3):
        producer.publish()
    work = WorkQueue.for_app(app)
    still_ready, to_schedule, lost = work.pop_ready(3)
    work.push([still_ready])
    work.schedule([(to_schedule, unix(clock.now()) + 3600)])

    assert sweep_once(app, clock) == 1
    assert sorted(work.pop_ready(10)) == sorted([still_ready, lost])
    assert sweep_once(app, clock) == 2  # popped and not claimed: both are lost now; the scheduled one is not
