"""Notifications go through Promesa's own deliveries: sinks (Slack-style and signed JSON) that
admins add, and operational events a team's own endpoints subscribe to."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from dashboard.operations import notifications
from dashboard.cli import cli
from dashboard.core.extensions import db
from dashboard.models import Delivery, Event, NotificationSink, Subscription
from promesa_receiver import verify
from dashboard.operations.sweeper import sweep_once

from tests.support.pipeline import deliver_due
from tests.support.switchable import SwitchableReceiver


@pytest.fixture
def sink():
    with SwitchableReceiver() as r:
        yield r


def _fail_five(app, producer, receiver, clock, **fields):
    sub = producer.subscribe(receiver.url + "/status/400", **fields)
    for _ in range(5):
        producer.publish()
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(minutes=2)
    return sub


def test_a_json_sink_gets_a_thin_signed_event_with_the_link(app, producer, receiver, clock, sink):
    app.config["PROMESA_BASE_URL"] = "https://promesa.example/"
    result = app.test_cli_runner().invoke(cli, ["sinks", "add", "--kind", "json", "--url", sink.url + "/hooks/secret-part"])
    assert result.exit_code == 0, result.output
    secret = result.output.strip().splitlines()[-1]
    assert secret.startswith("whsec_")
    listed = app.test_cli_runner().invoke(cli, ["sinks", "list"]).output
    assert "json" in listed and "secret-part" not in listed  # the address is shown without its secret part

    _fail_five(app, producer, receiver, clock)
    sweep_once(app)
    deliver_due(app, clock)
    [request] = sink.accepted()
    assert verify(request.body, request.headers["X-Signature"], secret, now=clock.now().timestamp())
    body = json.loads(request.body)
    assert body["type"] == "promesa.incident.opened" and body["version"] == 1
    assert body["data"]["rule"] == "dead_letters"
    assert body["data"]["url"] == f"https://promesa.example/incidents/{body['data']['incident_id']}"
    assert request.headers["X-Event-Type"] == "promesa.incident.opened"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_sinks_on_the_admin_page(client, auth, users, sink):
    auth.login("admin")
    resp = client.post("/sinks", data={"csrf_token": auth.csrf(), "kind": "json", "url": sink.url})
    assert resp.status_code == 400 and b"give the sink a name" in resp.data
    resp = client.post("/sinks", data={"csrf_token": auth.csrf(), "name": "n", "kind": "json", "url": "ftp://nope"})
    assert resp.status_code == 422 and db.session.scalar(select(NotificationSink)) is None
    resp = client.post("/sinks", data={"csrf_token": auth.csrf(), "name": "n", "kind": "pager", "url": sink.url})
    assert resp.status_code == 400 and b"kind must be one of" in resp.data
    resp = client.post("/sinks", data={"csrf_token": auth.csrf(), "name": "n", "kind": "json", "url": sink.url + "/x/y"})
    assert resp.status_code == 303 and b"whsec_" not in resp.data
    assert "whsec_" in client.get(resp.headers["Location"]).get_data(as_text=True)  # on the page it leads to
    page = client.get("/sinks").get_data(as_text=True)
    assert "whsec_" not in page and "/x/…" in page  # the secret once, never again
    sink_id = db.session.scalar(select(NotificationSink.id))
    client.post(f"/sinks/{sink_id}/remove", data={"csrf_token": auth.csrf()})
    assert db.session.scalar(select(NotificationSink)) is None
    assert db.session.scalar(select(Subscription.state).where(Subscription.url == sink.url + "/x/y")) == "disabled"


def test_a_team_subscribes_its_own_endpoint_to_operational_events(app, producer, receiver, clock, sink):
    ops = producer.subscribe(sink.url + "/ops", event_types=["promesa.*"])
    everything = producer.subscribe(receiver.url + "/ok", event_types=["*"])
    failing = _fail_five(app, producer, receiver, clock, event_types=["file.*"])
    clock.advance(minutes=2)
    sweep_once(app)
    deliver_due(app, clock)
    bodies = sink.accepted_json()
    types = sorted(b["type"] for b in bodies)
    assert types == ["promesa.delivery.dead"] * 5 + ["promesa.incident.opened"]
    dead = [b["data"] for b in bodies if b["type"] == "promesa.delivery.dead"]
    assert {d["subscription_id"] for d in dead} == {failing["id"]} and all(d["attempts"] == 3 for d in dead)
    assert len({d["delivery_id"] for d in dead}) == 5
    request = sink.accepted()[0]
    assert verify(request.body, request.headers["X-Signature"], ops["secret"], now=clock.now().timestamp())
    # "*" means the producer's own types: Promesa's operational events never arrive by surprise.
    got = db.session.scalars(select(Event.type).join(Delivery, Delivery.event_key == Event.key)
                             .where(Delivery.subscription_id == everything["id"])).all()
    assert set(got) == {"file.updated"}
    sweep_once(app)  # a second pass announces nothing twice
    deliver_due(app, clock)
    assert len(sink.accepted()) == 6


def test_a_dead_operational_event_makes_no_new_one(app, producer, receiver, clock):
    ops = producer.subscribe(receiver.url + "/status/400", event_types=["promesa.*"])
    _fail_five(app, producer, receiver, clock, event_types=["file.*"])
    clock.advance(minutes=2)
    sweep_once(app)  # five promesa.delivery.dead + one incident.opened, to an endpoint that answers 400
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(minutes=2)
    sweep_once(app)
    ops_deliveries = db.session.scalars(select(Delivery.state).where(Delivery.subscription_id == ops["id"])).all()
    assert sorted(ops_deliveries) == ["dead"] * 6  # and nothing new about their own deaths


def test_notify_stages_nothing_when_the_session_rolls_back(app, producer, receiver, sink):
    notifications.add_sink("slack", sink.url)
    assert notifications.notify("replay.finished", text="x", path="/", data={}) == 1
    db.session.rollback()
    assert db.session.scalar(select(Event).where(Event.type == "promesa.replay.finished")) is None
    assert notifications.replay_finished(subscription_id="sub_x", team_id=1, replayed=3, delivered=3) == 1
    db.session.commit()
    [event] = db.session.scalars(select(Event).where(Event.type == "promesa.replay.finished")).all()
    assert json.loads(event.body) == {"text": "Replay of 3 deliveries finished, 3 delivered. "
                                              "<http://localhost:5000/subscriptions/sub_x|Open in Promesa>"}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_sinks_command_works_as_its_own_process(database_url, tmp_path, sink):
    import os
    import subprocess
    import sys

    env = dict(os.environ, DATABASE_URL=database_url, PROMESA_INSTANCE_PATH=str(tmp_path / "cli"),
               PROMESA_ALLOW_PRIVATE_TARGETS="1")

    def promesa(*args):
        done = subprocess.run([sys.executable, "-m", "dashboard.cli", "sinks", *args], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert promesa("add", "--kind", "slack", "--url", sink.url + "/services/T1/B2/secret").startswith("added slack")
    listed = promesa("list")
    assert "slack" in listed and "secret" not in listed
    assert promesa("remove", listed.split()[0]).startswith("removed")
