"""Automatic disable, on the injected clock: every attempt failing for 5 days (counted from the
fifth failed attempt of the streak) disables the subscription, by `system`, with the reason shown
and the owners told; what arrives meanwhile is held, and enable and replay deliver it."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select

from dashboard.operations import notifications
from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Delivery, Subscription
from dashboard.operations.sweeper import sweep_once

from tests.support.pipeline import deliver_due
from tests.support.switchable import SwitchableReceiver


@pytest.fixture
def endpoint():
    with SwitchableReceiver(status=500) as r:
        yield r


@pytest.fixture
def owners_endpoint():
    with SwitchableReceiver(status=200) as r:
        yield r


def _state(sub_id):
    db.session.expire_all()
    return db.session.get(Subscription, sub_id).state


def test_five_days_of_failure_disable_and_nothing_is_lost(app, client, auth, users, producer, endpoint,
                                                         owners_endpoint, clock):
    sub = producer.subscribe(endpoint.url + "/hooks", event_types=["file.*"])
    producer.subscribe(owners_endpoint.url + "/ops", event_types=["promesa.subscription.disabled"])
    notifications.add_sink("slack", owners_endpoint.url + "/slack")
    start = clock.now()
    step = dt.timedelta(hours=6)
    # One event every 6 hours, each retried on its schedule: the streak reaches 5 failed attempts
    # in the third step, so the 5-day clock starts there (12 h in).
    for n in range(22):
        producer.publish()
        deliver_due(app, clock)
        sweep_once(app)
        assert _state(sub["id"]) == "active", f"disabled too early, after {clock.now() - start}"
        clock.advance(seconds=step.total_seconds())
    sweep_once(app)  # 5 days and 12 hours in: 5 days since the clock started
    assert _state(sub["id"]) == "disabled"
    disabled = db.session.get(Subscription, sub["id"])
    assert disabled.state_reason.startswith("disabled by the system: every attempt has failed for 5 days")
    [entry] = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "subscription.disabled")).all()
    assert (entry.actor_kind, entry.actor, entry.detail["automatic"]) == ("system", "system", True)

    # The owners are told: their own operational endpoint, and the sinks.
    deliver_due(app, clock)
    told = [(r.path, r.body) for r in owners_endpoint.accepted()]
    assert [path for path, body in told if b'"type":"promesa.subscription.disabled"' in body] == ["/ops"]
    assert [path for path, body in told if b"disabled by the system" in body and b'"text"' in body] == ["/slack"]
    auth.login("owner")
    assert "disabled by the system" in client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)

    # Events keep accumulating, held; enable and replay deliver them.
    attempts_before = len(endpoint.requests)
    for _ in range(2):
        producer.publish()
    deliver_due(app, clock)
    assert len(endpoint.requests) == attempts_before
    held = db.session.scalars(select(Delivery.id).where(Delivery.subscription_id == sub["id"],
                                                        Delivery.state == "held")).all()
    assert len(held) >= 2
    dead = db.session.scalars(select(Delivery.id).where(Delivery.subscription_id == sub["id"],
                                                        Delivery.state == "dead")).all()
    assert dead
    endpoint.status = 200
    assert producer.post(f"/api/v1/subscriptions/{sub['id']}/resume").status_code == 200
    assert producer.post(f"/api/v1/subscriptions/{sub['id']}/replay").status_code in (200, 202)
    deliver_due(app, clock)
    assert len(endpoint.accepted()) == len(held) + len(dead)
    left = db.session.scalars(select(Delivery.state).where(Delivery.subscription_id == sub["id"],
                                                           Delivery.state.in_(("held", "dead")))).all()
    assert left == []
    clock.advance(minutes=5)
    sweep_once(app)
    assert _state(sub["id"]) == "active"  # enabled again: the clock restarted, and it succeeds now


def test_the_days_are_configurable_and_a_success_stops_the_clock(app, producer, endpoint, clock):
    app.config["PROMESA_AUTO_DISABLE_DAYS"] = 1
    sub = producer.subscribe(endpoint.url + "/hooks")
    for n in range(5):  # 5 failed attempts by 2 h in, the clock starts
        producer.publish()
        deliver_due(app, clock)
        sweep_once(app)
        clock.advance(minutes=30)
    endpoint.status = 200
    producer.publish()
    deliver_due(app, clock)  # one success: the streak ends
    success_at = clock.now()
    endpoint.status = 500
    while _state(sub["id"]) == "active" and clock.now() < success_at + dt.timedelta(days=3):
        clock.advance(hours=5)
        producer.publish()
        deliver_due(app, clock)
        sweep_once(app)
    # The first streak's clock started 2 hours before the success: counting it would have disabled the
    # subscription at the pass 25 hours after the success. Only the new streak counts: a day after ITS clock.
    assert _state(sub["id"]) == "disabled"
    assert clock.now() - success_at > dt.timedelta(hours=25)


def test_a_410_disable_by_the_engine_is_announced_and_audited_once(app, producer, clock, owners_endpoint):
    with SwitchableReceiver(status=410) as gone:
        sub = producer.subscribe(gone.url + "/hooks", event_types=["file.*"])
        producer.subscribe(owners_endpoint.url + "/ops", event_types=["promesa.subscription.disabled"])
        producer.publish()
        deliver_due(app, clock)
    assert _state(sub["id"]) == "disabled"
    for _ in range(2):
        sweep_once(app)
        deliver_due(app, clock)
    [entry] = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "subscription.disabled")).all()
    assert (entry.actor, entry.subscription_id, entry.detail["reason"]) == ("system", sub["id"],
                                                                           "endpoint answered 410 Gone")
    [told] = owners_endpoint.accepted_json()
    assert told["type"] == "promesa.subscription.disabled" and told["data"]["subscription_id"] == sub["id"]
