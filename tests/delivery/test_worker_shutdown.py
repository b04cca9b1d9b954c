"""A worker's shutdown is always bounded: RQ's command-channel thread never holds the exit (rq/rq#1613)."""

from __future__ import annotations

import signal
import threading
import time
import uuid

import pytest
import redis

from dashboard.delivery.worker import DeliveryWorker, run
from dashboard.queue.work import WorkQueue

from tests.support.waiting import wait_until

# Far below RQ's 60 s wait, far above a bounded stop on a busy machine.
EXIT_BOUND_SECONDS = 10.0


def _bounded(call) -> float:
    """Run `call` in a thread; fail if it has not returned within the bound. Returns its seconds."""
    started = time.monotonic()
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(EXIT_BOUND_SECONDS)
    assert not thread.is_alive(), f"still stopping after {EXIT_BOUND_SECONDS} s"
    return time.monotonic() - started


def test_it_stops_the_command_thread_after_it_read_the_unsubscribe_reply(redis_url):
    # The race, made certain: the thread reads the unsubscribe reply and waits for a subscription before
    # stop() clears its flag. With RQ's own 60 s wait, redis-py's join at stop() waits the whole minute.
    conn = redis.Redis.from_url(redis_url)
    worker = DeliveryWorker([f"promesa-test-{uuid.uuid4().hex[:8]}"], connection=conn)
    worker.subscribe()
    wait_until(lambda: worker.pubsub.subscribed, timeout=5)
    worker.pubsub.unsubscribe()
    wait_until(lambda: not worker.pubsub.subscribed, timeout=5)
    time.sleep(0.1)  # the thread is back in its wait for a subscription
    _bounded(worker.unsubscribe)
    conn.close()


class _StillStopping(Exception):
    pass


def _raise_still_stopping(signum, frame):
    raise _StillStopping()


def test_a_burst_worker_starts_and_stops_many_times_each_within_the_bound(app):
    # The worker's loop installs signal handlers, so it runs in this (main) thread; an alarm bounds it.
    work = WorkQueue.for_app(app)
    previous = signal.signal(signal.SIGALRM, _raise_still_stopping)
    try:
        for round_ in range(12):
            signal.setitimer(signal.ITIMER_REAL, EXIT_BOUND_SECONDS)
            try:
                assert run(work, burst=True) == 0
            except _StillStopping:
                pytest.fail(f"burst worker {round_ + 1} still running after {EXIT_BOUND_SECONDS} s")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
