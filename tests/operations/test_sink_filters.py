"""Sinks have a name, a filter (which teams, which kinds of notification) and a test message."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from dashboard.cli import cli
from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Delivery, NotificationSink, Team
from dashboard.operations import notifications

from tests.support.pipeline import deliver_due
from tests.support.switchable import SwitchableReceiver

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


@pytest.fixture
def sink():
    with SwitchableReceiver() as r:
        yield r


def _heard(sink_row) -> list[str]:
    return db.session.scalars(select(Delivery.event_key).where(Delivery.subscription_id == sink_row.subscription_id)
                              ).all()


def test_a_filtered_sink_hears_only_its_teams_and_kinds(app, users, sink):
    acme = db.session.scalar(select(Team).where(Team.name == "acme"))
    other = db.session.scalar(select(Team).where(Team.name == "other"))
    everything, _ = notifications.add_sink("json", sink.url + "/all", name="everything")
    narrow, _ = notifications.add_sink("json", sink.url + "/acme", name="acme incidents", teams=["acme"],
                                       kinds=["incident.opened"])
    for kind, team in [("incident.opened", acme), ("incident.opened", other), ("incident.resolved", acme),
                       ("replay.finished", None)]:
        notifications.notify(kind, text="x", path="/", data={}, team_id=team.id if team else None)
    db.session.commit()
    assert len(_heard(everything)) == 4
    assert len(_heard(narrow)) == 1  # acme's opened incident, nothing else


def test_a_bad_filter_is_refused_and_adds_nothing(app, users, sink):
    for teams, kinds, says in [(["nobody"], [], "no team named nobody"), ([], ["incident.exploded"], "kinds are"),
                               (["promesa-system"], [], "no team named")]:
        with pytest.raises(Exception, match=says):
            notifications.add_sink("json", sink.url, name="x", teams=teams, kinds=kinds)
        db.session.rollback()
    assert db.session.scalar(select(NotificationSink)) is None


def test_an_admin_adds_a_named_filtered_sink_and_sends_it_a_test_message(app, client, auth, users, sink, clock):
    auth.login("admin")
    resp = client.post("/sinks", data={"csrf_token": auth.csrf(), "name": "#acme-oncall", "kind": "slack",
                                       "url": sink.url + "/services/T0/B0/credential", "teams": ["acme"],
                                       "kinds": ["incident.opened", "incident.resolved"]})
    assert resp.status_code == 201
    page = client.get("/sinks").get_data(as_text=True)
    assert "#acme-oncall" in page and "incident.opened, incident.resolved · teams acme" in page
    assert "credential" not in page
    row = db.session.scalar(select(NotificationSink))
    resp = client.post(f"/sinks/{row.id}/test", data={"csrf_token": auth.csrf()})
    assert resp.status_code == 302
    assert "Test message sent to #acme-oncall" in client.get("/sinks").get_data(as_text=True)
    deliver_due(app, clock)
    [message] = sink.accepted_json()
    assert "Test message from Promesa to the sink #acme-oncall" in message["text"]
    tested = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "sink.tested"))
    assert tested.actor == "admin@example.com" and tested.target == f"sink:{row.id}"
    added = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "sink.added"))
    assert added.detail["teams"] == ["acme"] and "credential" not in json.dumps(added.detail)


def test_the_cli_names_filters_and_tests_a_sink(app, users, sink, clock):
    runner = app.test_cli_runner()
    added = runner.invoke(cli, ["sinks", "add", "--kind", "json", "--url", sink.url + "/j", "--name", "ops",
                                "--team", "acme", "--only", "replay.finished"])
    assert added.exit_code == 0, added.output
    listed = runner.invoke(cli, ["sinks", "list"]).output
    assert "ops" in listed and "replay.finished · teams acme" in listed
    sink_id = db.session.scalar(select(NotificationSink.id))
    tested = runner.invoke(cli, ["sinks", "test", sink_id])
    assert tested.exit_code == 0 and "delivery dlv_" in tested.output
    deliver_due(app, clock)
    [request] = sink.accepted()
    assert json.loads(request.body)["type"] == "promesa.sink.test"
