"""Ingest's hand-off thread (gunicorn's workers run one): a request answers without waiting for Redis,
what gathers meanwhile goes in one push, and nothing queued is lost when the process stops."""

from __future__ import annotations

import threading


from dashboard.queue import handoff
from dashboard.queue.handoff import push_now
from dashboard.queue.work import WorkQueue

from tests.support.waiting import wait_until


def ready_items(app) -> list[str]:
    work = WorkQueue.for_app(app)
    return work.ready_items()


def test_requests_answer_while_redis_is_slow_and_what_gathers_goes_in_one_push(app, producer, receiver):
    producer.subscribe(receiver.url + "/ok")
    gate, pushes = threading.Event(), []

    def slow_push(items):
        pushes.append(list(items))
        assert gate.wait(10)  # Redis answering slowly: the first push holds the thread
        push_now(items)

    thread = app.extensions["promesa_handoff"] = handoff.HandOff(app, slow_push).start()
    try:
        accepted = [producer.publish()]
        assert wait_until(lambda: pushes, 10, every=0.01)
        accepted += [producer.publish() for _ in range(4)]  # each answers while the first push still waits
        assert len(pushes) == 1 and not ready_items(app)
        gate.set()
        thread.stop()
    finally:
        del app.extensions["promesa_handoff"]
    assert [len(p) for p in pushes] == [1, 4]
    assert len(ready_items(app)) == 5 and all(a["deliveries"] == 1 for a in accepted)


def test_under_load_pushes_are_spaced_so_that_each_carries_several_requests(app, producer, receiver):
    """A push costs nearly as much for one item as for ten: the next push after one waits out the interval."""
    import time

    producer.subscribe(receiver.url + "/ok")
    pushes = []

    def push(items):
        pushes.append(len(items))
        push_now(items)

    thread = app.extensions["promesa_handoff"] = handoff.HandOff(app, push, push_interval=2.0).start()
    try:
        producer.publish()
        assert wait_until(lambda: pushes, 1.5, every=0.01)  # the first after a quiet spell: at once
        for _ in range(3):
            time.sleep(0.05)  # each of these would otherwise be pushed on its own
            producer.publish()
        thread.stop()
    finally:
        del app.extensions["promesa_handoff"]
    assert pushes == [1, 3] and len(ready_items(app)) == 4


def test_stopping_pushes_what_is_queued_and_a_failed_push_does_not_end_the_thread(app, producer, receiver):
    producer.subscribe(receiver.url + "/ok")
    calls = []

    def push(items):
        calls.append(len(items))
        if len(calls) == 1:
            raise RuntimeError("a push that fails")
        push_now(items)

    thread = app.extensions["promesa_handoff"] = handoff.HandOff(app, push).start()
    try:
        producer.publish()  # its push fails: the sweeper owns that one
        assert wait_until(lambda: calls, 10, every=0.01)
        producer.publish()
        producer.publish()
        thread.stop()
    finally:
        del app.extensions["promesa_handoff"]
    assert sum(calls[1:]) == 2 and len(ready_items(app)) == 2


def test_starting_gives_the_app_its_thread(app):
    handoff.start(app)
    try:
        assert handoff.thread_of(app) is not None
    finally:
        handoff.thread_of(app).stop()
        del app.extensions["promesa_handoff"]


def test_each_gunicorn_worker_starts_its_thread_once_the_app_is_loaded(app):
    import gc
    from types import SimpleNamespace

    from dashboard.web import server as webserver

    webserver.post_worker_init(SimpleNamespace(wsgi=app))  # what gunicorn calls in each worker
    try:
        assert handoff.thread_of(app) is not None
    finally:
        gc.unfreeze()
        handoff.thread_of(app).stop()
        del app.extensions["promesa_handoff"]


def test_a_hung_redis_costs_bounded_memory_and_never_blocks_a_request(app, producer, receiver, clock, caplog):
    from dashboard.operations.sweeper import sweep_once

    producer.subscribe(receiver.url + "/ok")
    gate, pushes = threading.Event(), []

    def hung_push(items):
        pushes.append(list(items))
        assert gate.wait(10)
        push_now(items)

    thread = app.extensions["promesa_handoff"] = handoff.HandOff(app, hung_push, max_waiting=2).start()
    try:
        producer.publish()
        assert wait_until(lambda: pushes, 10, every=0.01)
        accepted = [producer.publish() for _ in range(4)]  # 2 wait for the push, 2 are left to the sweeper
        assert all(a["deliveries"] == 1 for a in accepted)
        assert sum("behind" in r.getMessage() for r in caplog.records) == 1
        gate.set()
        thread.stop()
    finally:
        del app.extensions["promesa_handoff"]
    assert [len(p) for p in pushes] == [1, 2] and len(ready_items(app)) == 3
    assert sweep_once(app, clock) == 2 and len(ready_items(app)) == 5  # the dropped ones, from the database


def test_a_large_batch_is_pushed_in_turns_and_a_request_arriving_meanwhile_goes_in_the_next_push(app):
    """One team's fan-out (50,000 items from one request) took seconds to push on a loaded machine, and another
    team's single event queued behind it waited all of them: a push carries at most PUSH_ITEMS."""
    gate, pushes = threading.Event(), []

    def push(items):
        pushes.append(list(items))
        assert gate.wait(10)  # the first part of the batch is on its way to Redis

    thread = handoff.HandOff(app, push).start()
    batch = [f"sub-a|dlv-{n:05}" for n in range(3 * handoff.PUSH_ITEMS + 5)]
    thread.put(batch)
    assert wait_until(lambda: pushes, 10, every=0.01)
    thread.put(["sub-b|dlv-b"])  # another request, while the batch's first part is pushed
    gate.set()
    thread.stop()
    assert [len(p) for p in pushes] == [handoff.PUSH_ITEMS, handoff.PUSH_ITEMS, handoff.PUSH_ITEMS, 6]
    assert pushes[1][0] == "sub-b|dlv-b"
    assert [item for p in pushes for item in p if item.startswith("sub-a")] == batch
