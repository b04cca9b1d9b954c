"""A disabled consumer's deliveries are held, and released when it is enabled; deleting a consumer holds nothing
back that was accepted (issue 37). Real receiver, real Redis, real database; the sweeper runs as in production."""

from __future__ import annotations

import json

from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.models import Delivery
from dashboard.operations.sweeper import sweep_once

from tests.support.pipeline import deliver_due


def to(producer, uid, n=1):
    ids = []
    for _ in range(n):
        resp = producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": uid, "data": {"resource_id": "i"}})
        assert resp.status_code == 202, resp.get_json()
        ids.append(resp.get_json()["id"])
    return ids


def arrived(receiver, path) -> list[str]:
    with receiver.lock:
        return [json.loads(r.body)["id"] for r in receiver.requests if r.path == path]


def held(sub_id) -> int:
    db.session.expire_all()
    return db.session.scalar(select(func.count()).select_from(Delivery).where(Delivery.subscription_id == sub_id,
                                                                              Delivery.state == "held"))


def deliver_and_sweep(app, clock):
    """What the workers and the sweeper would do over an hour: nothing due is left unsent."""
    for _ in range(3):
        deliver_due(app, clock)
        sweep_once(app)
        clock.advance(minutes=20)
    deliver_due(app, clock)


def test_nothing_reaches_a_disabled_consumer_and_everything_does_once_it_is_enabled(app, producer, receiver, clock):
    producer.put_consumer("alice")
    producer.put_consumer("bob")
    alices = producer.subscribe(receiver.url + "/ok/alice", consumer="alice")
    paused = producer.subscribe(receiver.url + "/ok/alice-paused", consumer="alice")
    producer.subscribe(receiver.url + "/ok/bob", consumer="bob")
    assert producer.post(f"/api/v1/subscriptions/{paused['id']}/pause").status_code == 200
    waiting = to(producer, "alice", 2)  # pending when the consumer is disabled
    producer.put_consumer("alice", state="disabled")
    assert held(alices["id"]) == 2
    while_disabled = to(producer, "alice", 2)  # accepted while disabled: held from the start
    bobs = to(producer, "bob", 2)
    deliver_and_sweep(app, clock)

    assert arrived(receiver, "/ok/alice") == [] and arrived(receiver, "/ok/alice-paused") == []
    assert sorted(arrived(receiver, "/ok/bob")) == sorted(bobs)  # the other consumer is not held with it
    assert held(alices["id"]) == 4 and held(paused["id"]) == 4

    enabled = producer.client.put("/api/v1/consumers/alice", json={"state": "active"}, headers=producer.headers())
    assert enabled.status_code == 200 and enabled.get_json()["state"] == "active"
    deliver_and_sweep(app, clock)
    assert sorted(arrived(receiver, "/ok/alice")) == sorted(waiting + while_disabled)  # each once
    assert arrived(receiver, "/ok/alice-paused") == [] and held(paused["id"]) == 4  # its own pause still holds
    assert producer.post(f"/api/v1/subscriptions/{paused['id']}/resume").status_code == 200
    deliver_and_sweep(app, clock)
    assert sorted(arrived(receiver, "/ok/alice-paused")) == sorted(waiting + while_disabled)


def test_deleting_a_consumer_with_pending_and_held_deliveries_holds_nothing_back(app, producer, receiver, clock):
    producer.put_consumer("alice")
    alices = producer.subscribe(receiver.url + "/ok/alice", consumer="alice")
    paused = producer.subscribe(receiver.url + "/ok/alice-paused", consumer="alice")
    assert producer.post(f"/api/v1/subscriptions/{paused['id']}/pause").status_code == 200
    pending = to(producer, "alice", 2)
    producer.put_consumer("alice", state="disabled")
    while_disabled = to(producer, "alice", 2)
    producer.put_consumer("alice", state="active")
    last = to(producer, "alice", 1)  # pending at the delete, never sent yet
    producer.put_consumer("alice", state="disabled")
    assert held(alices["id"]) == 5

    gone = producer.client.delete("/api/v1/consumers/alice", headers=producer.headers())
    assert gone.status_code == 200 and gone.get_json()["released"] == 10
    deliver_and_sweep(app, clock)
    everything = sorted(pending + while_disabled + last)
    assert sorted(arrived(receiver, "/ok/alice")) == everything
    assert sorted(arrived(receiver, "/ok/alice-paused")) == everything
    assert held(alices["id"]) == 0 and held(paused["id"]) == 0
    refused = producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": "alice"})
    assert refused.status_code == 422  # its uid names no consumer any more
