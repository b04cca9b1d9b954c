"""A "Send test event" button and POST /api/v1/subscriptions/<id>/test: a promesa.test event to one
endpoint through the real pipeline, and its outcome shown inline on the page."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Delivery

from tests.support.pipeline import deliver_due


def test_a_test_event_goes_to_that_endpoint_alone_whatever_its_filters_say(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/ok", event_types=["file.*"])
    producer.subscribe(receiver.url + "/status/200")  # takes every type, but is not the one tested
    producer.client.patch("/api/v1/team", json={"strict_event_types": True}, headers=producer.headers())
    resp = producer.post(f"/api/v1/subscriptions/{sub['id']}/test")
    assert resp.status_code == 202, resp.get_json()
    body = resp.get_json()
    deliver_due(app, clock)
    [got] = receiver.requests
    assert got.path == "/ok" and got.headers["X-Event-Type"] == "promesa.test"
    event = json.loads(got.body)
    assert event["id"] == body["event_id"] and event["type"] == "promesa.test"
    assert event["data"] == {"subscription_id": sub["id"], "test": True}
    assert db.session.get(Delivery, body["delivery_id"]).state == "succeeded"
    [entry] = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "subscription.test_sent")).all()
    assert entry.detail == {"event_id": body["event_id"]}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_paused_endpoint_is_told_to_resume_first(producer, receiver):
    sub = producer.subscribe(receiver.url + "/ok")
    producer.post(f"/api/v1/subscriptions/{sub['id']}/pause")
    resp = producer.post(f"/api/v1/subscriptions/{sub['id']}/test")
    assert resp.status_code == 409 and "resume it first" in resp.get_json()["error"]
    assert db.session.scalar(select(Delivery)) is None
    assert db.session.scalar(select(AuditEntry).where(AuditEntry.action == "subscription.test_sent")) is None


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_page_shows_the_outcome_inline_when_it_comes_back(app, client, auth, producer, receiver, clock, users):
    sub = producer.subscribe(receiver.url + "/status/503")
    auth.login("owner")
    sent = client.post(f"/subscriptions/{sub['id']}/test", headers={"HX-Request": "true"},
                       data={"csrf_token": auth.csrf()}).get_data(as_text=True)
    delivery = db.session.scalar(select(Delivery))
    poll = f"/subscriptions/{sub['id']}/test/{delivery.id}"
    assert f'hx-get="{poll}"' in sent and "waiting for the endpoint" in sent  # polls until an attempt exists
    deliver_due(app, clock)
    answered = client.get(poll, headers={"HX-Request": "true"}).get_data(as_text=True)
    assert "HTTP 503" in answered and "status 503 from /status/503" in answered
    assert "hx-get" not in answered and "hx-trigger" not in answered  # and then stops
    assert client.get(f"/subscriptions/{sub['id']}/test/dlv_unknown").status_code == 404


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_test_event_given_up_on_counts_in_no_health_figure(app, client, auth, producer, receiver, clock, users):
    from dashboard.models import OutcomeCount

    sub = producer.subscribe(receiver.url + "/status/503")
    producer.post(f"/api/v1/subscriptions/{sub['id']}/test")
    producer.publish()
    deliver_due(app, clock)  # both fail and wait for a retry
    auth.login("owner")
    client.post(f"/subscriptions/{sub['id']}/give-up", data={"csrf_token": auth.csrf()})
    assert db.session.scalar(select(func.count()).select_from(Delivery).where(Delivery.state == "dead")) == 2
    counted = db.session.execute(select(func.sum(OutcomeCount.failed), func.sum(OutcomeCount.dead))).one()
    assert tuple(counted) == (1, 1)  # the producer's event alone: its failed attempt, then its dead letter
