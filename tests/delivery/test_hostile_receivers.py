"""One receiver's answer, however broken, costs only its own attempt: every other team's deliveries
in the same drain are sent and recorded exactly once, and the drain goes on."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import Attempt, Delivery

from tests.conftest import Producer
from tests.support.hostile import HUGE_BYTES, RETRY_AFTER, HostileReceiver
from tests.support.pipeline import deliver_due


@pytest.fixture
def hostile():
    with HostileReceiver() as h:
        yield h


def attempts_for(subscription_id):
    db.session.expire_all()
    return db.session.execute(
        select(Attempt, Delivery).join(Delivery, Attempt.delivery_id == Delivery.id)
        .where(Delivery.subscription_id == subscription_id)).all()


def publish_beside_a_healthy_team(client, producer, receiver, hostile_url, **fields):
    """The hostile endpoint (team acme) and a healthy one of another team, in the same drain."""
    bad = producer.subscribe(hostile_url, event_types=["hostile.*"], **fields)
    other = Producer(client, "other-team")
    good = other.subscribe(receiver.url + "/ok", event_types=["healthy.*"])
    healthy_ids = [other.publish("healthy.ping", {"n": n})["id"] for n in range(5)]
    producer.publish("hostile.ping")
    return bad, good, healthy_ids


def assert_healthy_recorded_exactly_once(receiver, good, healthy_ids):
    rows = attempts_for(good["id"])
    assert sorted(d.event.id for _, d in rows) == sorted(healthy_ids)  # one attempt row each
    assert {(a.status_code, d.state) for a, d in rows} == {(200, "succeeded")}
    assert sorted(json.loads(r.body)["id"] for r in receiver.requests) == sorted(healthy_ids)  # sent once each


@pytest.mark.parametrize("value", sorted(RETRY_AFTER))
def test_an_odd_retry_after_is_ignored_or_capped_never_fatal(app, client, producer, receiver, hostile, clock, value):
    bad, good, healthy_ids = publish_beside_a_healthy_team(client, producer, receiver,
                                                           f"{hostile.url}/retry-after/{value}")
    deliver_due(app, clock)
    assert_healthy_recorded_exactly_once(receiver, good, healthy_ids)
    [(attempt, delivery)] = attempts_for(bad["id"])
    assert attempt.status_code == 429 and attempt.error is None
    assert delivery.state == "scheduled"
    wait = (delivery.next_attempt_at - clock.now()).total_seconds()
    assert 15 <= wait <= 24 * 3600  # the schedule's 15 - 30 s, or a Retry-After within the 24 h cap


def test_retry_after_parsing():
    from dashboard.delivery.http import retry_after_seconds

    assert retry_after_seconds("120", 0) == 120.0
    assert retry_after_seconds(" 7 ", 0) == 7.0
    for odd in ("\u00b2", "\u2460", "\u0661\u0662", "-5", "1e3", "", "soon", "Mon, 99 Foo 2026 25:61:61 GMT"):
        assert retry_after_seconds(odd, 0) is None, odd
    assert retry_after_seconds("9" * 400, 0) == float("inf")  # the policy caps it at 24 h
    assert retry_after_seconds("Thu, 01 Jan 1970 00:01:40 GMT", 40) == 60.0


@pytest.mark.parametrize("path", ["/bad-status", "/bad-status-code", "/bad-header", "/bad-chunking"])
def test_an_answer_that_is_not_http_is_an_invalid_response_without_a_status(app, client, producer, receiver,
                                                                             hostile, clock, path):
    bad, good, healthy_ids = publish_beside_a_healthy_team(client, producer, receiver, hostile.url + path)
    deliver_due(app, clock)
    assert_healthy_recorded_exactly_once(receiver, good, healthy_ids)
    [(attempt, delivery)] = attempts_for(bad["id"])
    # aiohttp refuses it with its own "400": that is not the receiver's status, and is not recorded as one
    assert attempt.status_code is None and attempt.error.startswith("invalid response: "), attempt.error
    assert delivery.state == "scheduled" and delivery.last_status_code is None


@pytest.mark.parametrize("path, status, excerpt", [
    ("/cut-after-head", 200, "[body unreadable: "),  # the status line answered; the body is only an excerpt
    ("/cut-mid-body", 200, "0123456789"),
    ("/gzip", 200, "compressed but readable"),
])
def test_a_broken_or_compressed_body_keeps_the_status_and_a_readable_excerpt(app, client, producer, receiver,
                                                                              hostile, clock, path, status, excerpt):
    bad, good, healthy_ids = publish_beside_a_healthy_team(client, producer, receiver, hostile.url + path)
    deliver_due(app, clock)
    assert_healthy_recorded_exactly_once(receiver, good, healthy_ids)
    [(attempt, delivery)] = attempts_for(bad["id"])
    assert attempt.status_code == status and attempt.response_excerpt.startswith(excerpt), attempt.response_excerpt
    assert len(attempt.response_excerpt) <= 1100


def test_a_connection_closed_without_an_answer_is_that_attempts_error(app, client, producer, receiver, hostile,
                                                                       clock):
    bad, good, healthy_ids = publish_beside_a_healthy_team(client, producer, receiver, hostile.url + "/close-at-once")
    deliver_due(app, clock)
    assert_healthy_recorded_exactly_once(receiver, good, healthy_ids)
    [(attempt, delivery)] = attempts_for(bad["id"])
    assert attempt.status_code is None and attempt.error and delivery.state == "scheduled"


def test_an_answer_at_one_byte_a_second_times_out(app, client, producer, receiver, hostile, clock):
    bad, good, healthy_ids = publish_beside_a_healthy_team(client, producer, receiver, hostile.url + "/trickle",
                                                           attempt_timeout=0.5)
    deliver_due(app, clock)
    assert_healthy_recorded_exactly_once(receiver, good, healthy_ids)
    [(attempt, delivery)] = attempts_for(bad["id"])
    assert attempt.error == "timeout" and attempt.status_code is None and attempt.duration_ms < 2000


def test_a_50_mb_answer_is_never_read_past_its_excerpt(app, client, producer, receiver, hostile, clock):
    bad, good, healthy_ids = publish_beside_a_healthy_team(client, producer, receiver, hostile.url + "/huge")
    deliver_due(app, clock)
    assert_healthy_recorded_exactly_once(receiver, good, healthy_ids)
    [(attempt, delivery)] = attempts_for(bad["id"])
    assert attempt.status_code == 200 and attempt.response_excerpt == "x" * 1024
    # The connection is dropped after the excerpt: what the receiver managed to write is what the
    # kernel's socket buffers took, not the body (a client that read it all would take 50 MB).
    assert hostile.huge_bytes_sent < HUGE_BYTES / 5, hostile.huge_bytes_sent


def test_deliveries_ask_for_an_uncompressed_answer(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/ok")
    producer.publish()
    deliver_due(app, clock)
    assert receiver.requests[0].headers["Accept-Encoding"] == "identity"


@pytest.mark.slow
def test_a_real_worker_stays_small_while_receivers_answer_50_mb_each(app, producer, receiver, hostile,
                                                                      database_url):
    """Peak memory of a real `promesa worker --burst`: five 50 MB answers at once cost what five
    small ones do (a worker that read them would hold 250 MB)."""
    from tests.delivery.test_worker_processes import spawn_worker

    if database_url.startswith("postgresql"):
        pytest.skip("a question of the HTTP client's memory, not of the database (runs on SQLite)")

    def peak_kb_delivering_to(url, event_type) -> int:
        producer.subscribe(url, event_types=[event_type])
        for _ in range(5):
            producer.publish(event_type)
        worker = spawn_worker(app, burst=True, peak_rss=True)
        out, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0
        return int(out.split()[-1])

    small = peak_kb_delivering_to(receiver.url + "/ok", "small.answer")
    huge = peak_kb_delivering_to(hostile.url + "/huge", "huge.answer")
    assert hostile.hits["/huge"] == 5 and receiver.count() == 5
    print(f"peak RSS of a burst worker: {small} KB for five small answers, {huge} KB for five of 50 MB")
    assert huge - small < 25 * 1024, (small, huge)
