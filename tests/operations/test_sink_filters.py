"""Sinks have a name, a filter (which teams, which kinds of notification) and a test message."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

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
    assert resp.status_code == 303 and resp.headers["Location"] == "/sinks"
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


def test_an_admin_changes_a_sinks_name_and_filter_and_the_audit_log_shows_old_and_new(app, client, auth, users,
                                                                                       sink):
    row, _ = notifications.add_sink("json", sink.url + "/j", name="acme incidents", teams=["acme"],
                                    kinds=["incident.opened"])
    auth.login("admin")
    resp = client.post(f"/sinks/{row.id}/edit", data={"csrf_token": auth.csrf(), "name": "#ops",
                                                      "kinds": ["replay.finished"]})
    assert resp.status_code == 302
    page = client.get("/sinks").get_data(as_text=True)
    assert ("Sink #ops changed (name, teams, notification kinds): it hears replay.finished · every team, and "
            "Promesa itself.") in page
    acme = db.session.scalar(select(Team).where(Team.name == "acme"))
    notifications.notify("incident.opened", text="x", path="/", data={}, team_id=acme.id)
    notifications.notify("replay.finished", text="x", path="/", data={}, team_id=None)
    db.session.commit()
    assert len(_heard(row)) == 1  # the replay only: the old filter is gone
    changed = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "sink.changed"))
    assert changed.actor == "admin@example.com" and changed.target == f"sink:{row.id}"
    assert changed.detail == {"before": {"name": "acme incidents", "teams": ["acme"], "kinds": ["incident.opened"]},
                              "after": {"name": "#ops", "teams": [], "kinds": ["replay.finished"]}}
    assert "<del>acme incidents</del> → <ins>#ops</ins>" in client.get("/audit").get_data(as_text=True)
    again = client.post(f"/sinks/{row.id}/edit", data={"csrf_token": auth.csrf(), "name": "#ops",
                                                       "kinds": ["replay.finished"]})
    assert again.status_code == 302
    assert "Nothing changed: the form was as saved." in client.get("/sinks").get_data(as_text=True)
    assert db.session.scalar(select(func.count()).where(AuditEntry.action == "sink.changed")) == 1


@pytest.mark.parametrize("form, says", [
    ({"name": " "}, "give the sink a name"),
    ({"name": "ops", "teams": ["nobody"]}, "no team named nobody"),
    ({"name": "ops", "kinds": ["incident.exploded"]}, "notification kinds are"),
    ({"name": "a\nb"}, "on one line"),
])
def test_a_bad_change_is_refused_with_its_reason_and_changes_nothing(app, client, auth, users, sink, form, says):
    row, _ = notifications.add_sink("json", sink.url + "/j", name="acme incidents", teams=["acme"])
    auth.login("admin")
    resp = client.post(f"/sinks/{row.id}/edit", data={"csrf_token": auth.csrf(), **form})
    assert resp.status_code == 400 and says in resp.get_data(as_text=True)
    db.session.expire_all()
    stored = db.session.get(NotificationSink, row.id)
    assert (stored.name, notifications.teams_named(stored.team_ids), stored.kinds) == ("acme incidents", ["acme"],
                                                                                     None)
    assert db.session.scalar(select(func.count()).where(AuditEntry.action == "sink.changed")) == 0
    assert client.post("/sinks/snk_nope/edit", data={"csrf_token": auth.csrf(), "name": "x"}).status_code == 404


def test_the_cli_changes_what_it_is_told_and_keeps_the_rest(app, users, sink):
    row, _ = notifications.add_sink("json", sink.url + "/j", name="ops", teams=["acme"], kinds=["incident.opened"])
    runner = app.test_cli_runner()
    kinds = runner.invoke(cli, ["sinks", "change", row.id, "--only", "incident.resolved"])
    assert kinds.exit_code == 0 and "changed sink" in kinds.output and "incident.resolved · teams acme" in kinds.output
    everyone = runner.invoke(cli, ["sinks", "change", row.id, "--every-team", "--name", "all teams"])
    assert everyone.exit_code == 0 and "name, teams" in everyone.output
    db.session.expire_all()
    stored = db.session.get(NotificationSink, row.id)
    assert (stored.name, stored.team_ids, stored.kinds) == ("all teams", None, ["incident.resolved"])
    same = runner.invoke(cli, ["sinks", "change", row.id, "--name", "all teams"])
    assert same.exit_code == 0 and "nothing changed" in same.output
    both = runner.invoke(cli, ["sinks", "change", row.id, "--team", "acme", "--every-team"])
    assert both.exit_code == 2 and "contradict" in both.output
    unknown = runner.invoke(cli, ["sinks", "change", row.id, "--team", "nobody"])
    assert unknown.exit_code == 1 and "no team named nobody" in unknown.output
