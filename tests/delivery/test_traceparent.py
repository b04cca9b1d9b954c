"""The producer's W3C traceparent (issue 41): stored with the event, sent on every attempt to a real receiver and
given with a pulled delivery; an invalid one is ignored, never refused. OpenTelemetry is off here: it goes as it came."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import Event

from tests.support.pipeline import deliver_due

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def sent_traceparents(receiver) -> list[str | None]:
    return [{name.lower(): value for name, value in got.headers.items()}.get("traceparent")
            for got in receiver.requests]


def stored(event_id: str) -> str | None:
    db.session.expire_all()
    return db.session.scalar(select(Event.traceparent).where(Event.id == event_id))


def test_the_producers_traceparent_goes_with_the_first_attempt_and_the_retry(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/flaky/1")
    accepted = producer.publish(headers={"traceparent": TRACEPARENT})
    deliver_due(app, clock)
    clock.advance(seconds=31)  # the retry is due within 30 s
    deliver_due(app, clock)
    assert receiver.count("/flaky/1") == 2
    assert sent_traceparents(receiver) == [TRACEPARENT, TRACEPARENT]
    assert stored(accepted["id"]) == TRACEPARENT


def test_a_batch_stores_it_with_each_event_and_an_event_without_one_sends_none(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/ok")
    resp = producer.post("/api/v1/events/batch", {"events": [{"type": "file.updated", "data": {"n": n}}
                                                             for n in range(2)]}, headers={"traceparent": TRACEPARENT})
    assert resp.status_code == 202, resp.get_json()
    plain = producer.publish()
    deliver_due(app, clock)
    by_event = {got.headers["X-Event-Id"]: trace for got, trace in zip(receiver.requests, sent_traceparents(receiver))}
    assert by_event == {**{a["id"]: TRACEPARENT for a in resp.get_json()["data"]}, plain["id"]: None}


@pytest.mark.parametrize("invalid", [
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",  # upper case
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # an all-zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # an all-zero parent id
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # the forbidden version
    TRACEPARENT + "-more",  # version 00 has exactly four fields
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
    "not a traceparent",
])
def test_an_invalid_traceparent_is_ignored_not_refused(app, producer, receiver, clock, invalid):
    producer.subscribe(receiver.url + "/ok")
    accepted = producer.publish(headers={"traceparent": invalid})
    deliver_due(app, clock)
    assert sent_traceparents(receiver) == [None]
    assert stored(accepted["id"]) is None


def test_a_later_version_is_read_as_version_00(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/ok")
    producer.publish(headers={"traceparent": "01" + TRACEPARENT[2:] + "-what-a-later-version-adds"})
    deliver_due(app, clock)
    assert sent_traceparents(receiver) == [TRACEPARENT]


def test_a_pulled_delivery_carries_it(producer):
    resp = producer.post("/api/v1/subscriptions", {"mode": "pull"})
    assert resp.status_code == 201, resp.get_json()
    sub = resp.get_json()
    producer.publish(headers={"traceparent": TRACEPARENT})
    producer.publish()
    resp = producer.get(f"/api/v1/subscriptions/{sub['id']}/pull?limit=10")
    assert resp.status_code == 200, resp.get_json()
    assert sorted(item["headers"].get("traceparent") or "" for item in resp.get_json()["data"]) == ["", TRACEPARENT]
