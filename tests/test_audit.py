"""The audit log names who changed what: a signed-in user, an API token's prefix, or the system."""

from __future__ import annotations

from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry


def _entries(action):
    return db.session.scalars(select(AuditEntry).where(AuditEntry.action == action).order_by(AuditEntry.id)).all()


def test_a_pause_from_the_dashboard_names_the_user(client, auth, producer, receiver, users):
    sub = producer.subscribe(receiver.url + "/status/200")
    producer.publish()
    auth.login("operator")
    client.post(f"/subscriptions/{sub['id']}/pause", data={"csrf_token": auth.csrf()})
    [entry] = _entries("subscription.paused")
    assert (entry.actor_kind, entry.actor) == ("user", "operator@example.com")
    assert entry.subscription_id == sub["id"] and entry.team_id == producer.team.id
    assert entry.deliveries == 1


def test_an_api_change_names_the_token_by_its_prefix(producer, receiver):
    sub = producer.subscribe(receiver.url + "/status/200")
    assert producer.post(f"/api/v1/subscriptions/{sub['id']}/pause").status_code == 200
    [created] = _entries("subscription.created")
    [paused] = _entries("subscription.paused")
    for entry in (created, paused):
        assert (entry.actor_kind, entry.actor) == ("token", producer.token[:10])
        assert producer.token not in str(entry.detail)


def test_the_engine_disabling_a_gone_receiver_is_recorded_as_the_system(app, producer, receiver, clock):
    from dashboard.operations.sweeper import sweep_once

    from .support import pipeline

    sub = producer.subscribe(receiver.url + "/status/410")
    producer.publish()
    producer.publish()
    pipeline.deliver_due(app, clock)
    sweep_once(app)  # the sweeper's pass records (and announces) what the engine did on its hot path
    sweep_once(app)
    [entry] = _entries("subscription.disabled")  # once, though two attempts were told 410 and two passes ran
    assert (entry.actor_kind, entry.actor) == ("system", "system")
    assert entry.subscription_id == sub["id"] and entry.team_id == producer.team.id
    assert "410" in entry.detail["reason"]


def test_api_changes_to_the_catalog_and_the_team_are_recorded(producer):
    schema = {"type": "object"}
    assert producer.post("/api/v1/event-types", {"name": "file.updated", "schema": schema}).status_code == 201
    assert producer.client.patch("/api/v1/team", json={"strict_event_types": True},
                                 headers=producer.headers()).status_code == 200
    [declared] = _entries("event_type.declared")
    [updated] = _entries("team.updated")
    assert declared.target == "event_type:file.updated@1" and declared.actor == producer.token[:10]
    assert updated.detail == {"strict_event_types": True} and updated.team_id == producer.team.id


def test_a_target_longer_than_the_log_keeps_is_shortened_not_refused(producer):
    name = "t" * 200  # the longest event type name the API takes
    resp = producer.post("/api/v1/event-types", {"name": name, "schema": {"type": "object"}})
    assert resp.status_code == 201, resp.get_json()
    [declared] = _entries("event_type.declared")
    assert len(declared.target) == 120 and declared.target.startswith("event_type:ttt") and declared.target[-1] == "…"
