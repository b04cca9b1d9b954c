"""Incidents, their notifications (Slack and JSON sinks), replays' notifications and the diagnosis name the consumer
whose endpoint they are about, and say nothing of one for a team's own endpoint (real receivers, real pipeline)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Consumer, Incident, Subscription
from dashboard.operations import notifications, replays
from dashboard.operations.sweeper import sweep_once

from tests.support.pipeline import deliver_due, run_worker
from tests.support.switchable import SwitchableReceiver


@pytest.fixture
def sinks():
    with SwitchableReceiver() as slack, SwitchableReceiver() as json_sink:
        notifications.add_sink("slack", slack.url + "/services/T1/B1/secret")
        notifications.add_sink("json", json_sink.url + "/hooks")
        yield slack, json_sink


def fail_five(app, producer, receiver, clock, consumer=None):
    """An endpoint (of `consumer`, or the team's own) answering 400 to five events: five dead letters, an incident."""
    sub = producer.subscribe(receiver.url + "/status/400", **({"consumer": consumer} if consumer else {}))
    for _ in range(5):
        payload = {"type": "invoice.paid", "data": {"resource_id": "i_1"}} | ({"consumer": consumer} if consumer else {})
        assert producer.post("/api/v1/events", payload).status_code == 202
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(minutes=2)
    return sub


def opened(slack, json_sink):
    [text] = [m["text"] for m in slack.accepted_json() if m["text"].startswith("Incident opened")]
    [event] = [e for e in json_sink.accepted_json() if e["type"] == "promesa.incident.opened"]
    return text, event["data"]


def test_an_incident_on_a_consumers_endpoint_names_the_consumer_everywhere(app, producer, receiver, clock, sinks):
    producer.put_consumer("alice")
    sub = fail_five(app, producer, receiver, clock, consumer="alice")
    sweep_once(app)
    deliver_due(app, clock)
    text, data = opened(*sinks)
    assert "(consumer alice)" in text and data["consumer"] == "alice"
    incident = producer.get("/api/v1/incidents").get_json()["data"][0]
    assert incident["consumer"] == "alice" and incident["subscription_id"] == sub["id"]
    entry = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "incident.opened"))
    assert entry.detail["consumer"] == "alice"
    diagnosis = producer.get(f"/api/v1/subscriptions/{sub['id']}/diagnosis").get_json()
    assert (diagnosis["consumer"], diagnosis["consumer_disabled"]) == ("alice", False)
    producer.put_consumer("alice", state="disabled")
    assert producer.get(f"/api/v1/subscriptions/{sub['id']}/diagnosis").get_json()["consumer_disabled"] is True


def test_a_team_endpoints_incident_names_no_consumer(app, producer, receiver, clock, sinks):
    sub = fail_five(app, producer, receiver, clock)
    sweep_once(app)
    deliver_due(app, clock)
    text, data = opened(*sinks)
    assert "consumer" not in text and data["consumer"] is None
    assert producer.get("/api/v1/incidents").get_json()["data"][0]["consumer"] is None
    assert "consumer" not in db.session.scalar(select(AuditEntry).where(AuditEntry.action == "incident.opened")).detail
    assert producer.get(f"/api/v1/subscriptions/{sub['id']}/diagnosis").get_json()["consumer"] is None
    assert db.session.scalar(select(Incident.id)) is not None


def test_a_replay_to_a_consumers_endpoint_is_told_with_its_consumer(app, producer, receiver, clock, sinks):
    slack, json_sink = sinks
    producer.put_consumer("alice")
    since = clock.now()
    assert producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": "alice"}).status_code == 202
    sub = producer.subscribe(receiver.url + "/ok/alice", consumer="alice")  # registered late
    consumer = db.session.scalar(select(Consumer).where(Consumer.uid == "alice"))
    replay, _ = replays.start_recover(consumer, db.session.get(Subscription, sub["id"]), since)
    run_worker(app)
    deliver_due(app, clock)
    assert receiver.count("/ok/alice") == 1
    [text] = [m["text"] for m in slack.accepted_json() if m["text"].startswith("Replay")]
    assert text.startswith("Replay to consumer alice of 1 deliveries")
    [event] = [e for e in json_sink.accepted_json() if e["type"] == "promesa.replay.finished"]
    assert event["data"]["consumer"] == "alice" and event["data"]["replay_id"] == replay.id


def test_operational_events_name_the_consumer_and_reach_the_teams_own_endpoints_alone(app, producer, receiver, clock):
    """`promesa.delivery.dead` and `promesa.incident.opened` about consumer bob's endpoint go to the team's own
    endpoint asking for them, naming bob; consumer alice's endpoint asking for `promesa.*` hears nothing of bob."""
    with SwitchableReceiver() as ops:
        producer.put_consumer("alice")
        producer.put_consumer("bob")
        producer.subscribe(ops.url + "/team", event_types=["promesa.*"])
        producer.subscribe(ops.url + "/alice", event_types=["promesa.*"], consumer="alice")
        bobs = fail_five(app, producer, receiver, clock, consumer="bob")
        clock.advance(minutes=2)
        sweep_once(app)
        deliver_due(app, clock)
        heard = [(r.path, json.loads(r.body)) for r in ops.accepted()]
    assert {path for path, _ in heard} == {"/team"}
    dead = [body["data"] for _, body in heard if body["type"] == "promesa.delivery.dead"]
    assert len(dead) == 5 and {(d["consumer"], d["subscription_id"]) for d in dead} == {("bob", bobs["id"])}
    [incident] = [body["data"] for _, body in heard if body["type"] == "promesa.incident.opened"]
    assert incident["consumer"] == "bob"
