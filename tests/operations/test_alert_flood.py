"""Alerts that cannot flood: 20 failing subscriptions and one 7-event batch give one incident per subscription
(listing both rules that fired), and each sink a handful of messages, the rest grouped per team; a failing
Slack-style sink is named by its label, never its URL, is not told about itself, and its own failure reaches
the other sinks once. Real Redis, a real database, real HTTP receivers; the clock is injected."""

from __future__ import annotations

import datetime as dt
import json
import re
from urllib.parse import urlsplit

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Delivery, Event, Incident, Subscription
from dashboard.operations import incident_rules, notifications
from dashboard.operations.sweeper import sweep_once

from tests.conftest import Producer
from tests.support.pipeline import deliver_due
from tests.support.switchable import SwitchableReceiver

BASE = "https://promesa.example"
FAILING_SECRET = "/services/T9/B9/failing-sink-secret"


@pytest.fixture
def receivers():
    with SwitchableReceiver(status=400) as endpoint, SwitchableReceiver() as good, SwitchableReceiver() as json_sink, \
            SwitchableReceiver(status=400) as failing:
        yield endpoint, good, json_sink, failing


def _texts(receiver) -> list[str]:
    return [json.loads(r.body)["text"] for r in receiver.accepted()]


def _deliver_until_settled(app, clock, rounds=4):
    for _ in range(rounds):  # a 4xx gets three attempts, minutes apart
        deliver_due(app, clock)
        clock.advance(minutes=2)


def test_twenty_failing_subscriptions_and_one_batch_do_not_flood_the_sinks(app, client, auth, users, clock,
                                                                         receivers):
    endpoint, good, json_receiver, failing = receivers
    app.config["PROMESA_BASE_URL"] = BASE
    good_sink, _ = notifications.add_sink("slack", good.url + "/services/T1/B1/good-secret")
    json_sink, _ = notifications.add_sink("json", json_receiver.url + "/hooks/json-secret")
    failing_sink, _ = notifications.add_sink("slack", failing.url + FAILING_SECRET)
    failing_url = failing.url + FAILING_SECRET
    alpha = Producer(client, "alpha")
    subs = [alpha.subscribe(endpoint.url + f"/hooks/{n}")["id"] for n in range(20)]
    batch = alpha.post("/api/v1/events/batch", {"events": [
        {"type": "file.updated", "data": {"resource_id": f"f_{n}"}} for n in range(7)]})
    assert batch.status_code == 202
    for _ in range(10):
        _deliver_until_settled(app, clock, rounds=1)
        if set(db.session.scalars(select(Delivery.state).where(Delivery.subscription_id.in_(subs)))) == {"dead"}:
            break
    assert set(db.session.scalars(select(Delivery.state).where(Delivery.subscription_id.in_(subs)))) == {"dead"}

    # One sweep: each subscription's outage is one incident, listing both rules that fired.
    sweep_once(app)
    incidents = db.session.scalars(select(Incident)).all()
    assert sorted(i.subscription_id for i in incidents) == sorted(subs)
    assert all(set(i.rules) == {"dead_letters", "failure_rate"} for i in incidents)
    assert all(i.rule == "dead_letters" and i.rules["failure_rate"]["figures"]["failed_percent"] == 100.0
               for i in incidents)
    _deliver_until_settled(app, clock)

    # Each sink: three incidents one by one, the other 17 in one message that links to the filtered list.
    texts = _texts(good)
    assert len(texts) == notifications.GROUP_AFTER + 1, texts
    # (they arrive in any order: the sinks' deliveries go concurrently)
    one_by_one = [t for t in texts if t.startswith("Incident opened:")]
    assert len(one_by_one) == 3 and all("Also fired: High failure rate" in t for t in one_by_one)
    [grouped] = [t for t in texts if t not in one_by_one]
    assert grouped.startswith("17 more incidents opened in team alpha.")
    link = re.search(r"<([^|>]+)\|Open in Promesa>", grouped).group(1).replace("&amp;", "&")  # Slack's escape
    assert link == f"{BASE}/incidents?team=alpha&state=open"
    json_events = [json.loads(r.body)["data"] for r in json_receiver.accepted()]
    [json_group] = [e for e in json_events if "count" in e]
    told_one_by_one = {e["incident_id"] for e in json_events if "incident_id" in e}
    assert len(json_events) == 4 and json_group["count"] == 17 and len(told_one_by_one) == 3
    assert set(json_group["incident_ids"]) == {i.id for i in incidents} - told_one_by_one
    auth.login("admin")
    listed = client.get(urlsplit(link).path + "?" + urlsplit(link).query).get_data(as_text=True)
    assert all(i.id in listed for i in incidents) and "Incidents of team alpha" in listed

    # The failing sink got the same four messages (each tried three times) and nothing else.
    assert len(failing.requests) == 4 * 3

    # Its own failure: once its dead letters fire a rule, the other sinks hear it once, by its label.
    sink_sub = db.session.get(Subscription, failing_sink.subscription_id)
    incident_rules.save_rule(sink_sub, "dead_letters", {"enabled": "on", "threshold": "1"}, "admin@example.com")
    good_before, json_before = len(good.requests), len(json_receiver.requests)
    for _ in range(3):  # later passes: the same incident, no second message
        sweep_once(app)
        _deliver_until_settled(app, clock, rounds=2)
    [own] = db.session.scalars(select(Incident).where(Incident.subscription_id == sink_sub.id)).all()
    label = notifications.sink_label(failing_sink)
    assert label == f"slack sink #{failing_sink.id}"
    new_texts = _texts(good)[good_before:]
    about_it = [t for t in new_texts if label in t]
    assert len(about_it) == 1 and about_it[0].startswith(f"Incident opened: Dead letters piling up on {label}")
    # (meanwhile alpha's outages may have gone quiet for their windows: their resolutions come, grouped as well)
    others = [t for t in new_texts if label not in t]
    assert len(others) <= notifications.GROUP_AFTER + 1 and all(" resolved" in t.split(":")[0] for t in others)
    json_about_it = [json.loads(r.body)["data"] for r in json_receiver.requests[json_before:]]
    assert [e.get("incident_id") for e in json_about_it].count(own.id) == 1
    # The failing sink is never told about itself.
    assert not any(label in r.body.decode() or own.id in r.body.decode() for r in failing.requests)

    # A sink's URL is a credential: in no message any sink received, no stored event body, no audit entry.
    secrets = [failing_url, FAILING_SECRET, "failing-sink-secret", "good-secret", "json-secret"]
    bodies = [r.body.decode() for r in (*good.requests, *json_receiver.requests, *failing.requests)]
    bodies += db.session.scalars(select(Event.body)).all()
    bodies += [json.dumps(d) for d in db.session.scalars(select(AuditEntry.detail)).all()]
    for secret in secrets:
        assert not any(secret in body for body in bodies), secret


def _six_incidents_told(app, client, clock, receivers):
    """Six failing subscriptions of team alpha open six incidents in one sweep, told to one Slack sink."""
    endpoint, good, _, _ = receivers
    notifications.add_sink("slack", good.url + "/services/T1/B1/good-secret")
    alpha = Producer(client, "alpha")
    for n in range(6):
        alpha.subscribe(endpoint.url + f"/hooks/{n}")
    alpha.post("/api/v1/events/batch", {"events": [{"type": "t", "data": {}} for _ in range(6)]})
    _deliver_until_settled(app, clock)
    sweep_once(app)
    _deliver_until_settled(app, clock, rounds=1)
    return good


def test_a_burst_of_resolutions_is_grouped_too(app, client, clock, receivers):
    good = _six_incidents_told(app, client, clock, receivers)
    assert len(_texts(good)) == 4
    clock.advance(minutes=20)  # both rules quiet for their 15-minute windows
    sweep_once(app)
    deliver_due(app, clock)
    # (The clock's 20-minute jump leaves due work looking late: Promesa's own backlog may open; not counted.)
    assert {i.state for i in db.session.scalars(select(Incident).where(Incident.subscription_id.is_not(None)))} \
        == {"resolved"}
    resolved = [t for t in _texts(good)[4:] if "Delivery backlog" not in t]
    assert len(resolved) == 4 and sum(t.startswith("Incident resolved:") for t in resolved) == 3
    [grouped] = [t for t in resolved if not t.startswith("Incident resolved:")]
    assert grouped.startswith("3 more incidents resolved in team alpha.")
    assert "/incidents?team=alpha&amp;state=resolved|" in grouped  # (Slack's escaping of the text)


def test_snoozed_incidents_are_left_out_of_the_grouped_message_too(app, client, clock, receivers):
    # "Snoozed: no notifications about it until then" holds in a burst as well.
    from dashboard.operations import incidents

    good = _six_incidents_told(app, client, clock, receivers)
    told = len(_texts(good))
    for incident in db.session.scalars(select(Incident)).all():
        incidents.snooze(incident, "oncall@example.com", clock.now() + dt.timedelta(hours=4))
    clock.advance(minutes=20)  # both rules quiet for their 15-minute windows: all six resolve in one sweep
    sweep_once(app)
    deliver_due(app, clock)
    assert [t for t in _texts(good)[told:] if "Delivery backlog" not in t] == []


def test_a_rule_firing_later_joins_the_open_incident_without_a_message(app, client, clock, receivers):
    """The outage is already announced: a second rule of the same subscription adds to its incident."""
    endpoint, good, _, _ = receivers
    notifications.add_sink("slack", good.url + "/services/T1/B1/good-secret")
    alpha = Producer(client, "alpha")
    sub = alpha.subscribe(endpoint.url + "/hooks")
    alpha.post("/api/v1/events/batch", {"events": [{"type": "t", "data": {}} for _ in range(5)]})
    _deliver_until_settled(app, clock)  # 5 dead letters, 15 failed attempts: dead_letters only
    sweep_once(app)
    [incident] = db.session.scalars(select(Incident)).all()
    assert list(incident.rules) == ["dead_letters"]
    alpha.post("/api/v1/events/batch", {"events": [{"type": "t", "data": {}} for _ in range(8)]})
    _deliver_until_settled(app, clock)  # 24 more failed attempts in the window: failure_rate fires too
    sweep_once(app)
    _deliver_until_settled(app, clock, rounds=1)
    db.session.expire_all()
    [incident] = db.session.scalars(select(Incident)).all()
    assert set(incident.rules) == {"dead_letters", "failure_rate"} and incident.subscription_id == sub["id"]
    assert len(_texts(good)) == 1
