"""Done means: a receiver fails, dead letters pile up, exactly one incident opens, a Slack-style sink
on 127.0.0.1 gets the link (after being down for a while: nothing is lost), on-call opens it and
acknowledges, the receiver recovers, an operator replays from the incident page, the incident
resolves and the sink hears that too. Real Redis, a real database, real HTTP; the clock is injected."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from sqlalchemy import select

from dashboard.cli import cli
from dashboard.core.extensions import db
from dashboard.models import Attempt, Delivery, Incident, NotificationSink
from dashboard.operations.sweeper import sweep_once

from tests.support.pipeline import deliver_due
from tests.support.switchable import SwitchableReceiver

BASE = "https://promesa.example"


@pytest.fixture
def sink():
    with SwitchableReceiver(status=503) as r:  # the chat service is down when the incident opens
        yield r


@pytest.fixture
def endpoint():
    with SwitchableReceiver(status=400) as r:  # the producer's receiver is broken
        yield r


def _links(sink) -> list[str]:
    return [re.search(r"<([^|>]+)\|Open in Promesa>", b["text"]).group(1) for b in sink.accepted_json()]


def test_from_failure_to_resolution(app, client, auth, producer, endpoint, sink, clock, users):
    app.config["PROMESA_BASE_URL"] = BASE
    added = app.test_cli_runner().invoke(cli, ["sinks", "add", "--kind", "slack", "--url", sink.url + "/services/T0/B0/x"])
    assert added.exit_code == 0, added.output
    sub = producer.subscribe(endpoint.url + "/hooks")

    # 1. the receiver fails; six dead letters pile up (a 4xx gets three attempts)
    for _ in range(6):
        producer.publish()
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(minutes=2)
    assert db.session.scalars(select(Delivery.state).where(Delivery.subscription_id == sub["id"])).all() == ["dead"] * 6

    # 2. exactly one incident opens; the sink is down, then back, and the message arrives with the link
    sweep_once(app)
    deliver_due(app, clock)
    assert sink.answers == [503] and sink.accepted() == []
    for _ in range(2):  # later passes: the same incident, no second message
        clock.advance(minutes=1)
        sweep_once(app)
        deliver_due(app, clock)
    [incident] = db.session.scalars(select(Incident)).all()
    assert (incident.rule, incident.state, incident.subscription_id) == ("dead_letters", "open", sub["id"])
    sink.status = 200
    clock.advance(minutes=5)
    deliver_due(app, clock)
    [opened] = sink.accepted_json()
    assert "Incident opened: Dead letters piling up on " + endpoint.url in opened["text"]
    [link] = _links(sink)
    assert link == f"{BASE}/incidents/{incident.id}"

    # 3. on-call opens the link, sees the right page, and acknowledges
    auth.login("oncall")
    page = client.get(urlsplit(link).path)
    text = page.get_data(as_text=True)
    assert page.status_code == 200 and incident.id in text and endpoint.url in text
    assert "6 dead-lettered in the 15-minute window, 6 still dead" in text
    assert "6 dead-lettered in the window: 0 replayed since, 6 still dead." in " ".join(text.split())
    client.post(urlsplit(link).path + "/acknowledge", data={"csrf_token": auth.csrf()})
    deliver_due(app, clock)
    assert "Incident acknowledged by oncall@example.com" in sink.accepted_json()[-1]["text"]
    client.post("/logout", data={"csrf_token": auth.csrf()})

    # 4. the receiver recovers; an operator replays from the incident page
    endpoint.status = 200
    auth.login("operator")
    resp = client.post(f"/incidents/{incident.id}/replay", data={"csrf_token": auth.csrf()}, follow_redirects=True)
    assert "Replaying 6 dead letters" in resp.get_data(as_text=True)
    deliver_due(app, clock)
    assert len(endpoint.accepted()) == 6
    assert db.session.scalars(select(Delivery.state).where(Delivery.subscription_id == sub["id"])).all() == \
        ["succeeded"] * 6

    # 5. a whole quiet window later the incident resolves, and the sink hears it
    sink.status = 503  # down again for a moment: the resolve notification waits and retries
    clock.advance(minutes=16)
    sweep_once(app)
    deliver_due(app, clock)
    db.session.expire_all()
    assert db.session.get(Incident, incident.id).state == "resolved"
    sink.status = 200
    clock.advance(minutes=1)
    deliver_due(app, clock)
    texts = [b["text"] for b in sink.accepted_json()]
    assert [t.split(":")[0] for t in texts] == ["Incident opened", "Incident acknowledged by oncall@example.com",
                                                "Incident resolved"]
    assert _links(sink) == [link] * 3

    # Nothing lost, and it is all visible like any delivery: the sink's subscription shows every try.
    sink_sub = db.session.scalar(select(NotificationSink.subscription_id))
    states = db.session.scalars(select(Delivery.state).where(Delivery.subscription_id == sink_sub)).all()
    assert states == ["succeeded"] * 3
    tries = db.session.scalars(select(Attempt.status_code).join(Delivery)
                               .where(Delivery.subscription_id == sink_sub).order_by(Attempt.id)).all()
    assert tries.count(503) == len(sink.answers) - 3 >= 2 and tries.count(200) == 3
