"""Finding an event (by id, type or data.resource_id) and seeing where it went; a delivery's request as sent."""

from __future__ import annotations

import re

from sqlalchemy import select

from dashboard.core import crypto
from promesa_receiver import signing
from dashboard.core.clock import unix
from dashboard.core.extensions import db
from dashboard.models import Attempt, Delivery, Event, Subscription

from tests.conftest import Producer
from tests.support import pipeline


def test_ingest_stores_the_resource_id_on_both_paths(producer, receiver):
    producer.subscribe(receiver.url + "/status/200")
    one = producer.publish(data={"resource_id": "f_42"})
    batch = producer.post("/api/v1/events/batch", {"events": [
        {"type": "file.updated", "data": {"resource_id": 7}},
        {"type": "file.updated", "data": {"resource_id": {"nested": 1}}},
        {"type": "file.updated", "data": {}}]})
    assert batch.status_code in (200, 202), batch.get_json()
    stored = dict(db.session.execute(select(Event.id, Event.resource_id)).all())
    assert stored[one["id"]] == "f_42"
    assert sorted((v for k, v in stored.items() if k != one["id"]), key=str) == ["7", None, None]


def test_search_finds_by_id_type_and_resource_within_the_teams_you_may_see(app, client, auth, producer, receiver, users):
    producer.subscribe(receiver.url + "/status/200")
    mine = producer.publish("invoice.paid", data={"resource_id": "inv_9"})
    theirs = Producer(client, "other")
    theirs.subscribe(receiver.url + "/status/200")
    hidden = theirs.publish("invoice.paid", data={"resource_id": "inv_9"})
    auth.login("member")

    for query in (f"q={mine['id']}", "q=inv_9", "q=invoice.paid", "q=inv_9&by=resource_id", "q=invoice.paid&by=type"):
        html = client.get("/events?" + query).get_data(as_text=True)
        assert mine["id"] in html and hidden["id"] not in html, query
    assert "No event you may see" in client.get("/events?q=inv_9&by=type").get_data(as_text=True)
    assert client.get(f"/events/{hidden['id']}").status_code == 404
    assert client.get("/events?q=x&by=body").status_code == 400

    auth.login("oncall")
    both = client.get("/events?q=inv_9").get_data(as_text=True)
    assert mine["id"] in both and hidden["id"] in both


def test_the_event_page_shows_the_body_and_every_delivery_with_its_attempts(app, client, auth, producer, receiver,
                                                                            users, clock):
    ok = producer.subscribe(receiver.url + "/status/200")
    failing = producer.subscribe(receiver.url + "/status/503")
    event = producer.publish(data={"resource_id": "f_1"})
    pipeline.deliver_due(app, clock)
    auth.login("member")
    html = client.get(f"/events/{event['id']}").get_data(as_text=True)
    assert "&#34;resource_id&#34;: &#34;f_1&#34;" in html  # the body, pretty-printed and escaped
    for sub in (ok, failing):
        assert sub["url"] in html
    assert '<span class="state state-succeeded">succeeded</span>' in html
    assert '<span class="state state-scheduled">scheduled</span>' in html and "Next attempt at" in html
    assert ">503<" in html and ">200<" in html


def test_the_delivery_page_shows_the_request_with_a_shortened_signature(app, client, auth, producer, receiver,
                                                                        users, clock):
    producer.subscribe(receiver.url + "/status/500")
    producer.publish()
    pipeline.deliver_due(app, clock)
    d = db.session.scalar(select(Delivery))
    attempt = db.session.scalar(select(Attempt))
    sub = db.session.get(Subscription, d.subscription_id)
    full = signing.promesa_v1(crypto.decrypt(sub.secret_ciphertext), int(unix(attempt.attempted_at)),
                              d.event.body.encode())
    auth.login("member")
    html = client.get(f"/deliveries/{d.id}").get_data(as_text=True)
    assert f"t={int(unix(attempt.attempted_at))},v1={full[:6]}…" in html
    assert full[:12] not in html  # never the whole signature
    assert f"<code>{d.id}</code>" in html and "X-Delivery-Attempt" in html
    assert re.search(r"next attempt at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", html)
    assert ">500<" in html and " ms<" in html


def test_the_page_lists_the_recent_events_you_may_see_newest_first_in_pages(
        app, client, auth, producer, receiver, users, monkeypatch):
    from dashboard.web.pages import events as events_page

    monkeypatch.setattr(events_page, "RESULTS", 2)
    first, second, third = (producer.publish("invoice.paid", data={"resource_id": f"inv_{n}"}) for n in range(3))
    hidden = Producer(client, "other").publish("invoice.paid")
    auth.login("member")

    html = client.get("/events").get_data(as_text=True)
    assert 'type="search"' in html  # the search stays
    shown = re.findall(r'href="/events/(evt_\w+)\?team=acme"', html)
    assert shown == [third["id"], second["id"]] and hidden["id"] not in html
    older = re.search(r'href="(/events\?before=[^"]+)">Older', html).group(1)
    last = client.get(older.replace("&amp;", "&")).get_data(as_text=True)
    assert re.findall(r'href="/events/(evt_\w+)\?team=acme"', last) == [first["id"]] and "Older" not in last

    auth.login("oncall")
    assert hidden["id"] in client.get("/events").get_data(as_text=True)
