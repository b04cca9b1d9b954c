"""The fault suite's harness: a private Redis it can stop, empty and restart, the whole of
`promesa up` as real processes on the test's PostgreSQL database, and the books every fault
test closes: every accepted event delivered or dead-lettered, none lost, duplicates only of
what was in flight, and never two attempts of one delivery at once."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from dashboard.app import create_app
from dashboard.core.clock import SystemClock
from dashboard.core.extensions import db
from dashboard.queue import heartbeat

from ..conftest import Producer, _empty_tables

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def promesa_env(app) -> dict:
    """The environment of a Promesa process serving the test app's installation (database, Redis, keys)."""
    cfg = app.config
    return dict(os.environ, DATABASE_URL=cfg["SQLALCHEMY_DATABASE_URI"], REDIS_URL=cfg["REDIS_URL"],
                SECRET_KEY=cfg["SECRET_KEY"], PROMESA_ENCRYPTION_KEY=cfg["PROMESA_ENCRYPTION_KEY"],
                PROMESA_INSTANCE_PATH=app.instance_path, PROMESA_REDIS_PREFIX=cfg["PROMESA_REDIS_PREFIX"],
                PROMESA_QUEUE=cfg["PROMESA_QUEUE"], PROMESA_ALLOW_PRIVATE_TARGETS="1",
                # Faults are found in seconds, not minutes: a lost lease or a flushed Redis is
                # noticed by the sweeper within these.
                PROMESA_SWEEP_INTERVAL_SECONDS="2", PROMESA_LEASE_SECONDS=str(cfg["PROMESA_LEASE_SECONDS"]),
                PROMESA_DRAIN_BUDGET_SECONDS="5")


class Stack:
    """`promesa up`: gunicorn, two workers and a sweeper, in a process group of its own."""

    def __init__(self, app, log_path: Path):
        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.up_args: list[str] = []  # more of `promesa up`'s options (e.g. --workers)
        self.env = promesa_env(app)

    def start(self) -> None:
        log = open(self.log_path, "a")
        self.process = subprocess.Popen([sys.executable, "-m", "dashboard.cli", "up", "--port", str(self.port), *self.up_args],
                                        env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert self.process.poll() is None, self.log()
                time.sleep(0.2)
        pytest.fail("promesa up never listened:\n" + self.log())

    def children(self) -> set[int]:
        """Process ids of up's children (web, workers, sweeper)."""
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.process.pid)], capture_output=True, text=True)
        return {int(pid) for pid in out.stdout.split()}

    def kill_everything(self) -> None:
        """SIGKILL to every Promesa process at once (the whole process group)."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        time.sleep(0.3)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        if self.process:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def publish(self, token: str, n: int, event_type="file.updated") -> tuple[list[str], Counter]:
        """POST n events one by one; the ids accepted (202) and the count of each status answered."""
        accepted, answers = [], Counter()
        for i in range(n):
            body = json.dumps({"type": event_type, "data": {"n": i}}).encode()
            request = urllib.request.Request(self.url + "/api/v1/events", data=body, method="POST", headers={
                "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as resp:
                    answers[resp.status] += 1
                    accepted.append(json.loads(resp.read())["id"])
            except urllib.error.HTTPError as error:
                answers[error.code] += 1
            except OSError:
                answers["refused"] += 1
        return accepted, answers


@pytest.fixture
def fault_redis_url(private_redis) -> str:
    """The Redis a fault test's Promesa uses: the private one (a test module may give another)."""
    return private_redis.url


@contextlib.contextmanager
def counting_app(database_url: str, redis_url: str, instance: Path, prefix: str, lease_seconds: int):
    """The app in the test process (for setup and counting), in its context, on a fault test's database and
    Redis, with the Redis prefix and queue name `prefix`."""
    app = create_app({"TESTING": True, "SQLALCHEMY_DATABASE_URI": database_url, "REDIS_URL": redis_url,
                      "INSTANCE_PATH": str(instance), "PROMESA_REDIS_PREFIX": prefix, "PROMESA_QUEUE": prefix,
                      "PROMESA_ALLOW_PRIVATE_TARGETS": True, "CLOCK": SystemClock(),
                      "PROMESA_LEASE_SECONDS": lease_seconds})
    with app.app_context():
        yield app
        with contextlib.suppress(sa.exc.DBAPIError):  # its connection may be one the test terminated
            db.session.remove()
        db.engine.dispose()


@pytest.fixture
def fault_app(request, fault_redis_url, tmp_path):
    """The app (in the test process, for setup and counting) on PostgreSQL and the fault test's Redis."""
    url = request.getfixturevalue("postgres_url")
    _empty_tables(url)
    with counting_app(url, fault_redis_url, tmp_path / "instance", "faults", lease_seconds=4) as app:
        yield app


@pytest.fixture
def stack(fault_app, tmp_path):
    s = Stack(fault_app, tmp_path / "promesa-up.log")
    yield s
    s.stop()


@pytest.fixture
def producer(fault_app):
    return Producer(fault_app.test_client(), "faults")


def query(sql: str, **params) -> list:
    """Rows on a connection of its own (no pool): the test terminates pooled connections meanwhile."""
    engine = sa.create_engine(db.engine.url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(sql), params).all()
    finally:
        engine.dispose()


def unsettled() -> int:
    """Deliveries neither succeeded nor dead-lettered."""
    return query("SELECT count(*) FROM deliveries WHERE state NOT IN ('succeeded', 'dead')")[0][0]


def close_the_books(accepted: list[str], receiver, in_flight_bound: int, subscription_id: str | None = None) -> dict:
    """Every accepted event delivered or dead-lettered, nothing lost, duplicates only of what was in
    flight, never two attempts of one delivery at once. Returns the figures for the README.
    `subscription_id`: the receiver's, where the events went to more than one."""
    states = dict(query("SELECT state, count(*) FROM deliveries "
                        "WHERE event_key IN (SELECT key FROM events WHERE id = ANY(:ids)) "
                        "AND (CAST(:subscription AS text) IS NULL OR subscription_id = :subscription) GROUP BY state",
                        ids=accepted, subscription=subscription_id))
    assert set(states) <= {"succeeded", "dead"} and sum(states.values()) == len(accepted), states
    received = Counter(json.loads(r.body)["id"] for r in receiver.requests)
    assert set(accepted) <= set(received), f"lost: {len(set(accepted) - set(received))}"
    duplicates = sum(received.values()) - len(received)
    assert duplicates <= in_flight_bound, (duplicates, in_flight_bound)
    # Two workers attempting one delivery at once would both record the same attempt number.
    same_number = query("SELECT count(*) FROM (SELECT delivery_id, number FROM attempts "
                        "GROUP BY delivery_id, number HAVING count(*) > 1) twice")[0][0]
    assert same_number == 0
    return {"accepted": len(accepted), "delivered": states.get("succeeded", 0), "dead": states.get("dead", 0),
            "lost": 0, "duplicates": duplicates}


# The processes of `promesa up` that beat: two delivery workers, a worker for each lane, the sweeper.
UP_BEATS = {("worker", "deliveries"): 2, ("worker", "checks"): 1, ("worker", "repairs"): 1, ("sweeper", None): 1}


def beating(conn, prefix: str, since: float = 0.0) -> Counter:
    """The live processes that beat after `since` (unix time), by kind and lane."""
    return Counter((b["kind"], b.get("lane")) for b in heartbeat.live(conn, prefix) if b["at"] > since)


def report(name: str, figures: dict) -> None:
    """The figures each fault test measured, for the README's reliability table (printed with -s)."""
    print(f"\nFAULT {name}: {json.dumps(figures)}")
