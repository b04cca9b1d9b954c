"""On-call's incident tools: acknowledge with a note, snooze (no notifications until a time), resolve by hand,
all audited; the badge counts what is open and unacknowledged; the list says team, rules, figures, duration."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Delivery, Event, Incident
from dashboard.operations import notifications
from dashboard.operations.sweeper import sweep_once

from tests.web.test_incident_pages import fired  # noqa: F401  (the fixture: one open dead_letters incident)

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def _notifications() -> list[str]:
    """The notification events staged for the sinks, by type."""
    team = notifications.system_team()
    return db.session.scalars(select(Event.type).where(Event.team_id == team.id).order_by(Event.created_at)).all()


def test_acknowledging_with_a_note_is_shown_told_and_audited(client, auth, fired, receiver):  # noqa: F811
    _, incident = fired
    notifications.add_sink("json", receiver.url + "/ok")
    auth.login("oncall")
    assert "1 open incident" in client.get("/").get_data(as_text=True)
    resp = client.post(f"/incidents/{incident.id}/acknowledge",
                       data={"csrf_token": auth.csrf(), "note": "restarting <billing>"})
    assert resp.status_code == 302
    page = client.get(f"/incidents/{incident.id}").get_data(as_text=True)
    assert "by oncall@example.com: “restarting &lt;billing&gt;”" in page
    assert "open incident" not in client.get("/").get_data(as_text=True)  # acknowledged: out of the badge
    [entry] = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "incident.acknowledged"))
    assert entry.actor == "oncall@example.com" and entry.detail == {"note": "restarting <billing>"}
    assert _notifications() == ["promesa.incident.acknowledged"]
    too_long = client.post(f"/incidents/{incident.id}/acknowledge", data={"csrf_token": auth.csrf(), "note": "x" * 501})
    assert too_long.status_code == 400


def test_a_snoozed_incident_sends_nothing_until_its_time_even_when_it_comes_back(app, client, auth, fired,  # noqa: F811
                                                                                 receiver, clock):
    sub, incident = fired
    notifications.add_sink("json", receiver.url + "/ok")
    auth.login("oncall")
    assert client.post(f"/incidents/{incident.id}/snooze", data={"csrf_token": auth.csrf(), "hours": "99"}
                       ).status_code == 400
    client.post(f"/incidents/{incident.id}/snooze", data={"csrf_token": auth.csrf(), "hours": "4"})
    db.session.refresh(incident)
    assert incident.snoozed_until == clock.now() + dt.timedelta(hours=4) and incident.snoozed_by == "oncall@example.com"
    overview = client.get("/").get_data(as_text=True)
    assert "open incident" not in overview and "incident snoozed" in overview  # snoozed: the row says so, no badge
    page = client.get(f"/incidents/{incident.id}").get_data(as_text=True)
    assert "snoozed until" in re.sub(r"<[^>]+>", "", page)  # the text a person reads

    client.post(f"/incidents/{incident.id}/resolve", data={"csrf_token": auth.csrf()})
    db.session.refresh(incident)
    assert incident.state == "resolved" and incident.resolved_by == "oncall@example.com"
    assert "by hand, by oncall@example.com" in client.get(f"/incidents/{incident.id}").get_data(as_text=True)
    sweep_once(app)  # the rule still fires: a new incident opens, snoozed like the old one
    reopened = db.session.scalar(select(Incident).where(Incident.resolved_at.is_(None)))
    assert reopened is not None and reopened.id != incident.id
    assert reopened.snoozed_until == incident.snoozed_until
    assert _notifications() == []  # nothing told while snoozed

    clock.advance(hours=5)
    client.post(f"/incidents/{reopened.id}/resolve", data={"csrf_token": auth.csrf()})
    assert _notifications() == ["promesa.incident.resolved"]  # the snooze is over
    actions = db.session.scalars(select(AuditEntry.action).where(AuditEntry.action.like("incident.%"))
                                 .order_by(AuditEntry.id)).all()
    assert actions == ["incident.opened", "incident.snoozed", "incident.resolved", "incident.opened",
                       "incident.resolved"]


def test_another_teams_owner_cannot_snooze_or_resolve(client, auth, fired):  # noqa: F811
    # Who may: whoever may acknowledge (on-call, operators, admins, the owning team); the matrix checks each role.
    _, incident = fired
    auth.login("outsider")
    assert client.post(f"/incidents/{incident.id}/resolve", data={"csrf_token": auth.csrf()}).status_code == 404
    assert client.post(f"/incidents/{incident.id}/snooze", data={"csrf_token": auth.csrf(), "hours": "1"}
                       ).status_code == 404
    db.session.expire_all()
    assert db.session.get(Incident, incident.id).snoozed_until is None
    assert db.session.get(Incident, incident.id).resolved_at is None


def test_the_list_shows_team_rules_figures_and_duration(client, auth, fired, clock):  # noqa: F811
    sub, incident = fired
    now = clock.now()
    # One outage, one incident: a second rule firing joins it.
    incident.rules = {**(incident.rules or {incident.rule: {}}), "failure_rate": {
        "figures": {"failed": 20, "attempts": 20, "failed_percent": 100.0, "threshold": 50, "min_attempts": 20,
                    "window_minutes": 15}}}
    incident.first_seen_at = now - dt.timedelta(minutes=30)
    db.session.commit()
    still_dead = db.session.scalar(select(func.count()).select_from(Delivery).where(Delivery.state == "dead"))
    auth.login("oncall")
    page = client.get("/incidents").get_data(as_text=True)
    assert '<td data-label="Team">acme</td>' in page
    assert "5 dead-lettered in the 15-minute window" in page
    assert '<code class="muted">dead_letters</code> <code class="muted">failure_rate</code>' in page
    assert "30 min so far" in page
    detail = client.get(f"/incidents/{incident.id}").get_data(as_text=True)
    assert f"5 dead-lettered in the 15-minute window, {still_dead} still dead" in detail
