"""A team's incidents over the API: listed and read as the page tells them, acknowledged with a note, snoozed,
resolved by hand, each audited with the token as the actor and told to the sinks; other teams' are not there."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select

from dashboard.core.clock import iso
from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Event

from tests.conftest import Producer
from tests.web.test_incident_pages import fired  # noqa: F401  (the fixture: one open dead_letters incident)

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def test_a_team_lists_and_reads_its_incidents_as_the_page_tells_them(app, client, producer, fired):  # noqa: F811
    sub, incident = fired
    listed = producer.get("/api/v1/incidents")
    assert listed.status_code == 200, listed.get_json()
    [shown] = listed.get_json()["data"]
    assert listed.get_json()["next_before"] is None
    assert shown["id"] == incident.id and shown["subscription_id"] == sub["id"] and shown["state"] == "open"
    assert shown["title"] == "Dead letters piling up" and shown["rules"][0] == "dead_letters"
    assert "5 dead-lettered in the 15-minute window (fires at 5)" in shown["figures"]
    assert shown["url"].endswith(f"/incidents/{incident.id}") and shown["acknowledged_at"] is None
    assert producer.get(f"/api/v1/incidents/{incident.id}").get_json() == shown
    assert producer.get("/api/v1/incidents?state=resolved").get_json()["data"] == []
    assert producer.get("/api/v1/incidents?state=open&limit=1").get_json()["data"] == [shown]
    bad = producer.get("/api/v1/incidents?state=exploded")
    assert bad.status_code == 400 and "state must be one of: open, acknowledged, resolved" in bad.get_json()["error"]

    other = Producer(client, "other")
    assert other.get("/api/v1/incidents").get_json()["data"] == []
    for path in ("", "/acknowledge", "/resolve"):
        method = other.get if not path else other.post
        resp = method(f"/api/v1/incidents/{incident.id}{path}")
        assert resp.status_code == 404 and "no incident" in resp.get_json()["error"]
    db.session.refresh(incident)
    assert incident.state == "open"


def test_acknowledge_snooze_and_resolve_over_the_api_are_audited_and_told(app, producer, fired, receiver,  # noqa: F811
                                                                         clock):
    from dashboard.operations import notifications

    _, incident = fired
    notifications.add_sink("json", receiver.url + "/ok")
    too_long = producer.post(f"/api/v1/incidents/{incident.id}/acknowledge", {"note": "x" * 501})
    assert too_long.status_code == 400
    assert "note must be a string of at most 500 characters" in too_long.get_json()["error"]
    with_nul = producer.post(f"/api/v1/incidents/{incident.id}/acknowledge", {"note": "a\x00b"})
    assert with_nul.status_code == 400 and "without NUL characters" in with_nul.get_json()["error"]
    acked = producer.post(f"/api/v1/incidents/{incident.id}/acknowledge", {"note": "rolling back <billing>"})
    assert acked.status_code == 200, acked.get_json()
    body = acked.get_json()
    assert body["state"] == "acknowledged" and body["note"] == "rolling back <billing>"
    assert body["acknowledged_by"].startswith("API token ") and body["acknowledged_at"] == iso(clock.now())
    again = producer.post(f"/api/v1/incidents/{incident.id}/acknowledge", {})
    assert again.status_code == 409 and "only an open one" in again.get_json()["error"]

    for until, status in [(clock.now() + dt.timedelta(days=30), 400), (clock.now() - dt.timedelta(minutes=1), 400)]:
        assert producer.post(f"/api/v1/incidents/{incident.id}/snooze",
                             {"until": iso(until)}).status_code == status
    assert producer.post(f"/api/v1/incidents/{incident.id}/snooze", {"until": "soon"}).status_code == 400
    # A zone other than UTC is converted, not dropped.
    local = (clock.now() + dt.timedelta(hours=4)).replace(tzinfo=dt.timezone.utc).astimezone(
        dt.timezone(dt.timedelta(hours=2)))
    snoozed = producer.post(f"/api/v1/incidents/{incident.id}/snooze", {"until": local.isoformat()})
    assert snoozed.status_code == 200
    assert snoozed.get_json()["snoozed_until"] == iso(clock.now() + dt.timedelta(hours=4))

    resolved = producer.post(f"/api/v1/incidents/{incident.id}/resolve")
    assert resolved.status_code == 200 and resolved.get_json()["state"] == "resolved"
    assert resolved.get_json()["resolved_by"].startswith("API token ")
    assert producer.post(f"/api/v1/incidents/{incident.id}/resolve").status_code == 409
    late = producer.post(f"/api/v1/incidents/{incident.id}/snooze", {"until": iso(clock.now() + dt.timedelta(hours=1))})
    assert late.status_code == 409 and "resolved" in late.get_json()["error"]

    entries = db.session.execute(select(AuditEntry.action, AuditEntry.actor_kind).where(
        AuditEntry.target == f"incident:{incident.id}").order_by(AuditEntry.id)).all()
    assert entries == [("incident.opened", "system"), ("incident.acknowledged", "token"),
                       ("incident.snoozed", "token"), ("incident.resolved", "token")]
    told = db.session.scalars(select(Event.type).where(Event.team_id == notifications.system_team().id)
                              .order_by(Event.created_at)).all()
    assert told == ["promesa.incident.acknowledged"]  # resolved while snoozed: the sinks are not told


def test_a_snooze_ends_over_the_api_as_on_the_page(producer, fired, clock):  # noqa: F811
    _, incident = fired
    until = iso(clock.now() + dt.timedelta(hours=4))
    assert producer.post(f"/api/v1/incidents/{incident.id}/snooze", {"until": until}).get_json()["snoozed_until"] == until
    ended = producer.post(f"/api/v1/incidents/{incident.id}/unsnooze")
    assert ended.status_code == 200 and ended.get_json()["snoozed_until"] is None
    again = producer.post(f"/api/v1/incidents/{incident.id}/unsnooze")
    assert again.status_code == 409 and "not snoozed" in again.get_json()["error"]
    assert db.session.scalars(select(AuditEntry.actor_kind).where(AuditEntry.action == "incident.unsnoozed")).all() \
        == ["token"]
