"""Processes that outlive what goes wrong around them: dead PostgreSQL connections, a failed drain
in a burst worker, a stop signal, and web servers that share nothing on the machine."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import func, select

from dashboard.ingest import writing as event_writing
from dashboard.ingest import autocommit
from dashboard.core.extensions import db
from dashboard.models import Attempt, Delivery
from dashboard.operations.sweeper import sweep_once

from tests.support.pipeline import deliver_due
from tests.delivery.test_worker_processes import spawn_worker, states


def terminate_other_backends(database_url: str) -> int:
    """What a failover or an operator's pg_terminate_backend does to every pooled connection."""
    admin = sa.create_engine(database_url, poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        killed = conn.execute(sa.text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                      "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalar()
    admin.dispose()
    time.sleep(0.2)  # the backends exit and their FATAL message reaches the clients' sockets
    return killed


@pytest.mark.postgres
def test_terminated_connections_cost_no_request_no_drain_and_no_sweep(app, producer, receiver, clock, database_url):
    if not database_url.startswith("postgresql"):
        pytest.skip("a PostgreSQL fault")
    producer.subscribe(receiver.url + "/ok")
    producer.publish()
    deliver_due(app, clock)  # every pool (web, engine) now holds live connections
    assert terminate_other_backends(database_url) >= 1
    resp = producer.post("/api/v1/events", {"type": "file.updated", "data": {}})
    assert resp.status_code == 202  # not a 500 on the stale pooled connection
    assert terminate_other_backends(database_url) >= 1
    assert deliver_due(app, clock) == 1  # claim and record on fresh connections
    assert terminate_other_backends(database_url) >= 1
    assert sweep_once(app, clock) == 0  # a sweep pass on a fresh connection too
    assert states() == {"succeeded": 2}


@pytest.mark.slow
def test_a_burst_worker_whose_drain_fails_exits_non_zero_and_frees_what_it_did_not_send(app, producer, receiver,
                                                                                       database_url):
    """The database refuses attempt rows: the drain cannot record, so it fails; `worker --burst` must
    say so with its exit status, and give back what it had claimed but not sent."""
    producer.subscribe(receiver.url + "/slow/0.05")
    for n in range(20):
        producer.publish("file.updated", {"n": n})
    if database_url.startswith("postgresql"):
        db.session.execute(sa.text("ALTER TABLE attempts ADD CONSTRAINT refuse_all CHECK (false) NOT VALID"))
    else:
        db.session.execute(sa.text("CREATE TRIGGER refuse_all BEFORE INSERT ON attempts "
                                   "BEGIN SELECT RAISE(ABORT, 'attempts refused'); END"))
    db.session.commit()
    try:
        worker = spawn_worker(app, burst=True, capture=True,
                              extra_env={"PROMESA_MAX_IN_FLIGHT_PER_SUBSCRIPTION": "1"})  # one at a time
        _, stderr = worker.communicate(timeout=90)
    finally:
        if database_url.startswith("postgresql"):
            db.session.execute(sa.text("ALTER TABLE attempts DROP CONSTRAINT refuse_all"))
        else:
            db.session.execute(sa.text("DROP TRIGGER refuse_all"))
        db.session.commit()
    assert worker.returncode != 0, stderr[-3000:]
    assert "drain failed" in stderr
    assert "Unclosed client session" not in stderr
    db.session.expire_all()
    leased = db.session.scalar(select(func.count()).select_from(Delivery).where(Delivery.lease_token.is_not(None)))
    sent = [json.loads(r.body)["id"] for r in receiver.requests]
    # Each drain fails at its first write: what it had sent keeps its lease (no attempt row could say
    # it was sent), what it had not was given back at once, and the next drain took it; none twice.
    assert len(sent) == len(set(sent)) and leased == len(sent)
    assert db.session.scalar(select(func.count()).select_from(Attempt)) == 0


@pytest.mark.slow
def test_a_worker_stopped_by_sigterm_closes_its_http_session(app, producer, receiver):
    producer.subscribe(receiver.url + "/ok")
    producer.publish()
    worker = spawn_worker(app, capture=True)
    try:
        assert receiver.wait_for(1, timeout=30)
        time.sleep(0.5)  # the drain records and lingers
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr[-3000:]
    assert "Unclosed client session" not in stderr and "Unclosed connector" not in stderr
    assert states() == {"succeeded": 1}


def test_a_burst_worker_closes_its_http_session(app, producer, receiver):
    producer.subscribe(receiver.url + "/ok")
    producer.publish()
    worker = spawn_worker(app, burst=True, capture=True)
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr[-3000:]
    assert "Unclosed client session" not in stderr and "Unclosed connector" not in stderr
    assert json.loads(receiver.requests[0].body)["type"] == "file.updated"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_web_server_opens_no_control_socket_in_the_home_folder(redis_url, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    port = _free_port()
    env = dict(os.environ, HOME=str(home), DATABASE_URL=f"sqlite:///{tmp_path / 'promesa.db'}",
               REDIS_URL=redis_url, PROMESA_INSTANCE_PATH=str(tmp_path / "instance"))
    web = subprocess.Popen([sys.executable, "-m", "dashboard.cli", "web", "--port", str(port), "--workers", "1"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("the web server never listened")
        time.sleep(0.5)  # gunicorn opens its control socket once it runs
        assert not list(home.rglob("*")), list(home.rglob("*"))  # no ~/.gunicorn/gunicorn.ctl for all to share
    finally:
        web.terminate()
        web.wait(timeout=15)


@pytest.mark.postgres
def test_a_request_whose_connection_dies_mid_way_runs_again_with_its_body(app, producer, receiver, database_url,
                                                                        monkeypatch):
    """The second run must read the same body: a view that read it uncached left nothing to read (a 400)."""
    if not database_url.startswith("postgresql"):
        pytest.skip("a PostgreSQL fault")
    producer.subscribe(receiver.url + "/ok")
    killed = []
    real_execute = psycopg.Cursor.execute

    def kill_once(cursor, query, *args, **kwargs):
        # On the driver's cursor: ingest sends its statements there, not all through SQLAlchemy.
        if not killed and isinstance(query, str) and "subscriptions" in query:  # routing: after the body was parsed
            killed.append(_terminate_backend(cursor.connection.info.backend_pid, database_url))
        return real_execute(cursor, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", kill_once)
    db.session.commit()  # the test's own session holds no transaction, as a web process's does not
    resp = producer.post("/api/v1/events", {"type": "file.updated", "data": {"resource_id": "f_9"}})
    monkeypatch.undo()
    assert killed == [True]
    assert resp.status_code == 202, resp.get_json()
    assert db.session.scalar(select(func.count()).select_from(Delivery)) == 1


def _terminate(conn) -> bool:
    """pg_terminate_backend on this connection's server process, from another connection."""
    return _terminate_backend(conn.connection.dbapi_connection.info.backend_pid, db.engine.url)


def _terminate_backend(pid: int, database_url) -> bool:
    admin = sa.create_engine(database_url, poolclass=sa.pool.NullPool)
    with admin.connect() as other:
        done = other.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
    admin.dispose()
    time.sleep(0.2)  # until the server has closed the socket
    return done


@pytest.mark.parametrize("stored_before_the_loss", [True, False], ids=["written", "not-written"])
def test_an_ingest_write_whose_connection_dies_stores_the_event_once_and_answers_202(
        app, producer, receiver, clock, database_url, monkeypatch, stored_before_the_loss):
    """A write in autocommit that lost its connection may or may not have been stored; the answer is 202
    either way, with exactly one event and one delivery (it used to be a 500 when the write had been sent)."""
    if not database_url.startswith("postgresql"):
        pytest.skip("a PostgreSQL fault")
    producer.subscribe(receiver.url + "/ok")
    real_insert, lost = event_writing.insert_events, []

    def insert_then_lose_the_connection(*args):
        if not lost:
            assert autocommit.in_autocommit()  # the production path
            pid = autocommit.pooled_connection().driver_connection.info.backend_pid
            if stored_before_the_loss:  # stored, and the answer lost with the connection
                real_insert(*args)
            lost.append(_terminate_backend(pid, database_url))  # the write meets the dead connection
        real_insert(*args)

    monkeypatch.setattr(event_writing, "insert_events", insert_then_lose_the_connection)
    db.session.commit()  # the test's own session holds no transaction, as a web process's does not
    resp = producer.post("/api/v1/events", {"id": "evt_once", "type": "file.updated", "data": {"resource_id": "f_1"}})
    assert lost == [True]
    assert resp.status_code == 202, resp.get_json()
    assert resp.get_json()["id"] == "evt_once"
    assert db.session.scalar(select(func.count()).select_from(Delivery)) == 1
    deliver_due(app, clock)
    assert len(receiver.requests) == 1
