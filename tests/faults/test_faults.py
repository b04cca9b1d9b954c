"""Faults on real services: a private Redis stopped, emptied and restarted; every Promesa process
SIGKILLed; PostgreSQL connections terminated; a receiver down past its whole schedule. Each test
publishes a known set of events, causes the fault, and closes the books (see conftest)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from dashboard.core.clock import utcnow
from dashboard.operations.sweeper import sweep_once
from tests.support.pipeline import deliver_due
from tests.support.receiver import Receiver
from tests.core.test_outages import terminate_other_backends

from ..support.waiting import wait_until
from tests.faults.conftest import close_the_books, query, report, unsettled

# The outage. Workers back off up to 5 s between tries, so a 20 s outage covers several
# backoff steps and the first try after Redis returns.
REDIS_OUTAGE_SECONDS = 20
# Requests one worker keeps in flight to one endpoint, times the two workers of `promesa up`.
IN_FLIGHT_PER_ENDPOINT = 8 * 2


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


def tracebacks(log: str) -> int:
    return log.count("Traceback (most recent call last)")


def test_redis_down_during_ingest_and_delivery(stack, producer, receiver, private_redis):
    producer.subscribe(receiver.url + "/slow/0.02")
    stack.start()
    children = stack.children()
    before, answers = stack.publish(producer.token, 100)
    assert answers == {202: 100}

    private_redis.stop(keep_data=True)
    down_at = time.monotonic()
    during, answers = stack.publish(producer.token, 50)  # ingest goes on into the database
    assert answers == {202: 50}
    time.sleep(max(0.0, REDIS_OUTAGE_SECONDS - (time.monotonic() - down_at)))
    private_redis.start()

    accepted = before + during
    assert wait_until(lambda: unsettled() == 0, timeout=60), unsettled()
    assert stack.process.poll() is None and stack.children() == children  # nobody died, nobody was restarted
    log = stack.log()
    figures = close_the_books(accepted, receiver, in_flight_bound=IN_FLIGHT_PER_ENDPOINT)
    down_lines = len(re.findall("Redis is unreachable", log))
    figures.update(outage_seconds=REDIS_OUTAGE_SECONDS, tracebacks=tracebacks(log), down_lines=down_lines,
                   back_lines=len(re.findall("Redis is back", log)))
    report("redis down 20 s during ingest and delivery", figures)
    # One line per process and state change (web workers, 2 workers, sweeper), not one per try.
    assert down_lines <= 8, log[-5000:]
    assert figures["tracebacks"] <= 4, log[-5000:]  # at most the drains that were running when it went


def test_redis_restarted_empty(stack, producer, receiver, private_redis):
    producer.subscribe(receiver.url + "/slow/0.02")
    stack.start()
    accepted, answers = stack.publish(producer.token, 120)
    assert answers == {202: 120}
    private_redis.stop(keep_data=False)  # mid-delivery: ready list, retries and drain slots gone
    private_redis.start()
    assert wait_until(lambda: unsettled() == 0, timeout=60), unsettled()
    assert stack.process.poll() is None
    report("redis restarted empty", close_the_books(accepted, receiver, in_flight_bound=IN_FLIGHT_PER_ENDPOINT))


def _scrape(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.status, resp.read().decode()


def test_redis_that_hangs_without_closing(stack, producer, receiver, private_redis):
    """Paused (SIGSTOP), Redis accepts connections and reads commands, and answers nothing: a frozen
    server, or a network that drops packets. Every call gives up after PROMESA_REDIS_TIMEOUT_SECONDS."""
    stack.env.update(PROMESA_REDIS_TIMEOUT_SECONDS="1", PROMESA_BACKLOG_ALERT_MINUTES="0")
    producer.subscribe(receiver.url + "/slow/0.02")
    stack.start()
    before, answers = stack.publish(producer.token, 40)
    assert answers == {202: 40}
    assert wait_until(lambda: unsettled() == 0, timeout=60), unsettled()

    private_redis.pause()
    hung_at = utcnow()
    # More requests asking Redis than the web has threads (2 processes of 4): each answers after its
    # timeout, so none is left holding a thread that ingest then waits for.
    with ThreadPoolExecutor(12) as pool:
        scraped = list(pool.map(lambda _: _scrape(stack.url + "/metrics"), range(12)))
    assert all(status == 200 and "promesa_redis_ready NaN" in body for status, body in scraped)
    during, answers = stack.publish(producer.token, 30)
    assert answers == {202: 30}
    # The sweeper judges the backlog from the database before its Redis step: the alert fires while Redis hangs.
    assert wait_until(lambda: query("SELECT count(*) FROM incidents WHERE rule = 'backlog' AND opened_at > :t",
                                    t=hung_at)[0][0] == 1, timeout=30)
    hung_seconds = (utcnow() - hung_at).total_seconds()
    private_redis.resume()

    accepted = before + during
    assert wait_until(lambda: unsettled() == 0, timeout=60), unsettled()
    log = stack.log()
    assert "Redis is unreachable (Timeout" in log, log[-5000:]  # noticed as away, not waited on
    figures = close_the_books(accepted, receiver, in_flight_bound=IN_FLIGHT_PER_ENDPOINT)
    figures.update(hung_seconds=round(hung_seconds, 1), scrapes_answered=len(scraped), tracebacks=tracebacks(log))
    report("redis hung (SIGSTOP) during ingest, scrapes and sweeps", figures)


def test_every_promesa_process_sigkilled_and_restarted(stack, producer, receiver):
    producer.subscribe(receiver.url + "/slow/0.3")  # about 3 s of delivery: the kill lands in the middle
    stack.start()
    accepted, answers = stack.publish(producer.token, 150)
    assert answers == {202: 150}
    assert receiver.wait_for(20, timeout=30)
    stack.kill_everything()  # web, workers, sweeper and up itself, mid-delivery
    assert unsettled() > 0
    # What the receiver had and no attempt row says was sent: on the wire, or answered but not yet
    # recorded, when the workers died. Only these may arrive twice.
    unrecorded_at_kill = receiver.count() - query("SELECT count(*) FROM attempts")[0][0]
    stack.start()
    assert wait_until(lambda: unsettled() == 0, timeout=60), unsettled()
    figures = close_the_books(accepted, receiver, in_flight_bound=unrecorded_at_kill)
    figures.update(unrecorded_at_kill=unrecorded_at_kill)
    report("every Promesa process SIGKILLed and restarted", figures)


def test_postgres_connections_terminated_mid_run(stack, producer, receiver, fault_app):
    producer.subscribe(receiver.url + "/slow/0.02")
    stack.start()
    accepted, answers = stack.publish(producer.token, 60)
    killed = 0
    publishing = {}

    def publish_meanwhile():
        publishing["ids"], publishing["answers"] = stack.publish(producer.token, 90)

    thread = threading.Thread(target=publish_meanwhile)
    thread.start()
    for _ in range(3):  # while ingest, drains and sweeps all hold pooled connections
        time.sleep(1.0)
        killed += terminate_other_backends(fault_app.config["SQLALCHEMY_DATABASE_URI"])
    thread.join(timeout=60)
    accepted += publishing["ids"]
    answers += publishing["answers"]
    assert answers == {202: 150}  # not one 500 on a dead pooled connection
    assert wait_until(lambda: unsettled() == 0, timeout=60), unsettled()
    log = stack.log()
    assert "drain failed" not in log and "sweep failed" not in log, log[-5000:]
    failed_jobs = redis.Redis.from_url(fault_app.config["REDIS_URL"]).zcard("rq:failed:faults")
    assert failed_jobs == 0
    figures = close_the_books(accepted, receiver, in_flight_bound=IN_FLIGHT_PER_ENDPOINT)
    figures.update(connections_terminated=killed, failed_jobs=failed_jobs, http_500=answers.get(500, 0))
    report("PostgreSQL connections terminated mid-run (3 times)", figures)


def test_a_receiver_down_past_the_schedule_then_replayed(fault_app, producer):
    """On the injected clock: eight attempts over a day and a half, against a closed port."""
    from dashboard.core.clock import FrozenClock

    clock = FrozenClock()
    fault_app.config["CLOCK"] = clock
    with Receiver() as down:
        port_url = down.url
    sub = producer.subscribe(port_url + "/ok")  # nothing listens there now
    accepted = [producer.publish("file.updated", {"n": n})["id"] for n in range(30)]
    for _ in range(12):
        deliver_due(fault_app, clock)
        clock.advance(hours=6)
        sweep_once(fault_app, clock)
    assert unsettled() == 0
    with Receiver(port=int(port_url.rsplit(":", 1)[1])) as back:
        resp = producer.post(f"/api/v1/subscriptions/{sub['id']}/replay")
        assert resp.get_json() == {"replayed": 30}
        deliver_due(fault_app, clock)
        figures = close_the_books(accepted, back, in_flight_bound=0)
    assert figures["delivered"] == 30 and figures["duplicates"] == 0
    report("receiver down past the schedule, then replayed", figures)


def test_promesa_up_restarts_a_child_that_dies(stack, producer, receiver):
    producer.subscribe(receiver.url + "/ok")
    stack.start()
    children = stack.children()
    assert len(children) == 6  # web, two delivery workers, a worker for each of the two lanes, sweeper
    victim = max(children)  # the last started: the sweeper
    os.kill(victim, signal.SIGKILL)
    assert wait_until(lambda: len(stack.children()) == 6 and victim not in stack.children(), timeout=15)
    accepted, answers = stack.publish(producer.token, 20)  # the web never went away
    assert answers == {202: 20}
    assert wait_until(lambda: unsettled() == 0, timeout=30), unsettled()
    assert "restarting it in" in stack.log()
    report("a child of promesa up SIGKILLed", close_the_books(accepted, receiver, in_flight_bound=0))
