"""POST /api/v1/events and friends: what a producer sees, including every way to get it wrong."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.models import Delivery, Event


def counts():
    return (db.session.scalar(select(func.count()).select_from(Event)),
            db.session.scalar(select(func.count()).select_from(Delivery)))


def test_it_accepts_an_event_with_one_delivery_per_matching_subscription(producer, receiver):
    producer.subscribe(receiver.url + "/ok", event_types=["file.*"])
    producer.subscribe(receiver.url + "/ok", event_types=["user.created"])
    producer.subscribe(receiver.url + "/ok")  # all types
    resp = producer.post("/api/v1/events", {"type": "file.updated", "data": {"resource_id": "f_1"}})
    assert resp.status_code == 202
    body = resp.get_json()
    assert body["id"].startswith("evt_") and body["deliveries"] == 2 and body["duplicate"] is False
    assert counts() == (1, 2)


def test_the_event_page_shows_deliveries_and_attempts(producer, receiver, app, clock):
    from tests.support.pipeline import deliver_due

    producer.subscribe(receiver.url + "/ok")
    event_id = producer.publish("file.updated", {"resource_id": "f_9"})["id"]
    deliver_due(app, clock)
    resp = producer.get(f"/api/v1/events/{event_id}")
    assert resp.status_code == 200
    body = resp.get_json()
    assert body["id"] == event_id and body["data"] == {"resource_id": "f_9"}
    [d] = body["deliveries"]
    assert d["state"] == "succeeded" and d["attempts"][0]["status_code"] == 200


def test_idempotency_key_returns_the_first_event(producer, receiver):
    producer.subscribe(receiver.url + "/ok")
    first = producer.post("/api/v1/events", {"type": "a.b"}, headers={"Idempotency-Key": "k-1"}).get_json()
    again = producer.post("/api/v1/events", {"type": "a.b"}, headers={"Idempotency-Key": "k-1"})
    assert again.status_code == 202
    assert again.get_json() == {"id": first["id"], "deliveries": 1, "duplicate": True}
    assert counts() == (1, 1)


def test_a_repeated_event_id_returns_the_first_event(producer, receiver):
    producer.subscribe(receiver.url + "/ok")
    first = producer.post("/api/v1/events", {"type": "a.b", "id": "order-42"})
    again = producer.post("/api/v1/events", {"type": "a.b", "id": "order-42"})
    assert first.get_json()["id"] == again.get_json()["id"] == "order-42"
    assert again.get_json()["duplicate"] is True
    assert counts() == (1, 1)


def test_event_ids_are_unique_per_team_not_across_teams(producer, client, receiver, app, clock):
    """Another team's use of an id is none of this team's business: no 409, no hint that it exists,
    and each receiver gets the id its producer chose."""
    from tests.conftest import Producer
    from tests.support.pipeline import deliver_due

    producer.subscribe(receiver.url + "/ok/acme")
    mine = producer.post("/api/v1/events", {"type": "a.b", "id": "shared-id", "data": {"team": "acme"}})
    other = Producer(client, team_name="other")
    other.subscribe(receiver.url + "/ok/other")
    theirs = other.post("/api/v1/events", {"type": "a.b", "id": "shared-id", "data": {"team": "other"}})
    assert mine.status_code == theirs.status_code == 202
    assert mine.get_json() == theirs.get_json() == {"id": "shared-id", "deliveries": 1, "duplicate": False}
    again = other.post("/api/v1/events", {"type": "a.b", "id": "shared-id"}).get_json()
    assert again == {"id": "shared-id", "deliveries": 1, "duplicate": True}
    assert counts() == (2, 2)
    assert producer.get("/api/v1/events/shared-id").get_json()["data"] == {"team": "acme"}
    assert other.get("/api/v1/events/shared-id").get_json()["data"] == {"team": "other"}
    deliver_due(app, clock)
    received = {r.path: (json.loads(r.body), r.headers["X-Event-Id"]) for r in receiver.requests}
    assert received["/ok/acme"] == ({"id": "shared-id", "type": "a.b", "version": 1, "data": {"team": "acme"},
                                     "timestamp": received["/ok/acme"][0]["timestamp"]}, "shared-id")
    assert received["/ok/other"][0]["data"] == {"team": "other"} and received["/ok/other"][1] == "shared-id"
    page = other.get(f"/api/v1/subscriptions/{other.get('/api/v1/subscriptions').get_json()['data'][0]['id']}"
                     "/deliveries").get_json()
    assert [d["event_id"] for d in page["data"]] == ["shared-id"]


def test_a_batch_repeating_another_teams_ids_is_stored_whole(producer, client):
    from tests.conftest import Producer

    producer.post("/api/v1/events/batch", {"events": [{"type": "a.b", "id": "one"}, {"type": "a.b", "id": "two"}]})
    other = Producer(client, team_name="other")
    resp = other.post("/api/v1/events/batch", {"events": [{"type": "a.b", "id": "two"}, {"type": "a.b", "id": "one"}]})
    assert resp.status_code == 202 and [a["duplicate"] for a in resp.get_json()["data"]] == [False, False]
    assert counts()[0] == 4


def test_another_team_cannot_read_an_event(producer, client):
    from tests.conftest import Producer

    event_id = producer.publish()["id"]
    other = Producer(client, team_name="other")
    assert other.get(f"/api/v1/events/{event_id}").status_code == 404


@pytest.mark.parametrize("headers, status, words", [
    ({}, 401, "missing bearer token"),
    ({"Authorization": "Bearer pk_not-a-token"}, 401, "invalid"),
    ({"Authorization": "Basic abc"}, 401, "missing bearer token"),
])
def test_it_rejects_bad_tokens(client, headers, status, words):
    resp = client.post("/api/v1/events", json={"type": "a.b"}, headers=headers)
    assert resp.status_code == status and words in resp.get_json()["error"]
    assert counts() == (0, 0)


@pytest.mark.parametrize("payload, headers", [
    ({"type": 5}, {}),  # a body the model refuses
    ({"type": "a.b", "data": {"x": "\u0000"}}, {}),  # one the event checks refuse
    ({"type": "a.b"}, {"Idempotency-Key": "x" * 300}),  # a header ingest refuses
])
def test_a_bad_token_is_told_before_a_bad_request(client, payload, headers):
    """The single-event route checks its token inside the routing read, after the body: its errors still
    put the token first, as every other route does."""
    resp = client.post("/api/v1/events", json=payload, headers={"Authorization": "Bearer pk_not-a-token"} | headers)
    assert resp.status_code == 401 and "invalid or revoked token" in resp.get_json()["error"]
    assert counts() == (0, 0)


def test_a_revoked_token_of_a_team_with_subscriptions_and_declared_types_is_refused(producer, clock):
    """The token is checked by the statement that outer-joins the routing and the catalog: a revoked token
    must not come back as a row of the team's subscriptions."""
    from dashboard.models import ApiToken

    producer.subscribe("https://hooks.example.com/a")
    assert producer.post("/api/v1/event-types", {"name": "a.b", "version": 1, "schema": {"type": "object"}}
                         ).status_code == 201
    assert producer.publish("a.b", {})["deliveries"] == 1
    for token in db.session.scalars(select(ApiToken).where(ApiToken.team_id == producer.team.id)):
        token.revoked_at = clock.now()
    db.session.commit()
    for body in ({"type": "a.b"}, {"type": "a.b", "version": 1}, {"type": "other"}):
        resp = producer.post("/api/v1/events", body)
        assert resp.status_code == 401 and "invalid or revoked token" in resp.get_json()["error"]
    assert counts() == (1, 1)


def test_a_revoked_token_is_refused_at_once(producer, clock):
    from dashboard.models import ApiToken

    producer.publish()
    for token in db.session.scalars(select(ApiToken).where(ApiToken.team_id == producer.team.id)):
        token.revoked_at = clock.now()
    db.session.commit()
    resp = producer.post("/api/v1/events", {"type": "a.b"})
    assert resp.status_code == 401 and "invalid or revoked token" in resp.get_json()["error"]
    assert counts()[0] == 1


@pytest.mark.parametrize("payload, status, words", [
    ({"data": {}}, 400, "missing required field(s): type"),
    ({"type": 5}, 400, "type must be a string"),
    ({"type": ""}, 400, "type must be a string"),
    ({"type": "has space"}, 400, "type must be a string"),
    ({"type": "a.b", "data": [1, 2]}, 400, "data must be a JSON object"),
    ({"type": "a.b", "data": "text"}, 400, "data must be a JSON object"),
    ({"type": "a.b", "colour": "red"}, 400, "unknown field(s): colour"),
    ({"type": "a.b", "id": 12}, 400, "id must be a string"),
    ({"type": "a.b", "id": "x" * 65}, 400, "id must be a string"),
    ([1, 2, 3], 400, "must be a JSON object"),
    ({"type": "a.b", "data": {"blob": "x" * 9000}}, 413, "the cap is 8192 bytes"),
])
def test_it_rejects_bad_events_and_stores_nothing(producer, receiver, payload, status, words):
    producer.subscribe(receiver.url + "/ok")
    resp = producer.post("/api/v1/events", payload)
    assert resp.status_code == status
    assert words in resp.get_json()["error"]
    assert counts() == (0, 0)


def test_it_rejects_a_body_that_is_not_json(producer):
    resp = producer.client.post("/api/v1/events", data="{not json", headers=producer.headers(
        **{"Content-Type": "application/json"}))
    assert resp.status_code == 400 and "not valid JSON" in resp.get_json()["error"]
    resp = producer.client.post("/api/v1/events", data="type=a.b", headers=producer.headers(
        **{"Content-Type": "application/x-www-form-urlencoded"}))
    assert resp.status_code == 415 and "application/json" in resp.get_json()["error"]
    assert counts() == (0, 0)


def test_it_rejects_a_body_over_the_size_cap(producer):
    resp = producer.client.post("/api/v1/events", data='{"type":"a.b","data":{"x":"' + "y" * (1024 * 1024) + '"}}',
                                headers=producer.headers(**{"Content-Type": "application/json"}))
    assert resp.status_code == 413 and "larger than the limit" in resp.get_json()["error"]
    assert counts() == (0, 0)


def test_it_rejects_an_oversized_idempotency_key(producer):
    resp = producer.post("/api/v1/events", {"type": "a.b"}, headers={"Idempotency-Key": "k" * 256})
    assert resp.status_code == 400 and "Idempotency-Key" in resp.get_json()["error"]
    assert counts() == (0, 0)


def test_unknown_routes_and_methods_answer_json(producer):
    resp = producer.get("/api/v1/nothing-here")
    assert resp.status_code == 404 and resp.get_json()["error"]
    resp = producer.client.delete("/api/v1/events", headers=producer.headers())
    assert resp.status_code == 405 and "DELETE" in resp.get_json()["error"]


def test_accepted_work_survives_a_redis_outage(producer, receiver, app, clock):
    """Redis down at ingest: the producer still gets 202 (the event is in the database); the sweeper enqueues it."""
    from dashboard.operations.sweeper import sweep_once

    from tests.support.pipeline import deliver_due

    producer.subscribe(receiver.url + "/ok")
    real_url = app.config["REDIS_URL"]
    app.extensions.pop("promesa_redis", None)
    app.config["REDIS_URL"] = "redis://127.0.0.1:1/0"  # nothing listens there
    resp = producer.post("/api/v1/events", {"type": "a.b"})
    assert resp.status_code == 202
    app.extensions.pop("promesa_redis", None)
    app.config["REDIS_URL"] = real_url
    assert sweep_once(app, clock) == 1
    deliver_due(app, clock)
    assert receiver.count() == 1


def test_a_batch_is_stored_in_one_go(producer, receiver, app, clock):
    from tests.support.pipeline import deliver_due

    producer.subscribe(receiver.url + "/ok")
    resp = producer.post("/api/v1/events/batch", {"events": [
        {"type": "a.b", "id": "one"}, {"type": "a.c", "data": {"n": 2}}, {"type": "a.b", "id": "one"}]})
    assert resp.status_code == 202
    first, second, repeated = resp.get_json()["data"]
    assert first == {"id": "one", "deliveries": 1, "duplicate": False}
    assert second["deliveries"] == 1 and not second["duplicate"]
    assert repeated == {"id": "one", "deliveries": 1, "duplicate": True}
    assert counts() == (2, 2)
    again = producer.post("/api/v1/events/batch", {"events": [{"type": "a.b", "id": "one"}]}).get_json()
    assert again["data"] == [{"id": "one", "deliveries": 1, "duplicate": True}]
    deliver_due(app, clock)
    assert receiver.count() == 2


def test_awkward_data_arrives_exactly_as_sent(producer, receiver, app, clock):
    """Quotes, escapes, astral characters and nesting survive the batch insert and the body (NUL is refused:
    tests/web/test_bad_input.py)."""
    from tests.support.pipeline import deliver_due

    producer.subscribe(receiver.url + "/ok")
    data = {"q": 'say "hi"\\', "escaped": "a\\u0000b", "emoji": "\U0001F680 é ñ 日本", "nested": {"l": [1, 2.5, None, True]},
            "big": 2 ** 62, "empty": {}}
    resp = producer.post("/api/v1/events/batch", {"events": [
        {"type": "a.b", "id": "weird:id.1", "data": data, "timestamp": "2026-01-02T03:04:05Z"},
        {"type": "a.b", "data": {}}]})
    assert resp.status_code == 202, resp.get_json()
    deliver_due(app, clock)
    bodies = {json.loads(r.body)["id"]: json.loads(r.body) for r in receiver.requests}
    sent = bodies["weird:id.1"]
    assert sent["data"] == data and sent["timestamp"] == "2026-01-02T03:04:05.000Z" and sent["type"] == "a.b"
    assert len(bodies) == 2 and all(b["version"] == 1 for b in bodies.values())


@pytest.mark.parametrize("payload, status, words", [
    ({"events": [{"type": "a.b"}, {"type": "a b"}]}, 400, "events[1]: type must be a string"),
    ({"events": [{"type": "a.b"}, {"type": "a.b", "data": {"x": "y" * 9000}}]}, 413, "events[1]: data is"),
    ({"events": []}, 400, "events must be a list of 1 to 500"),
    ({"events": [{"type": "a.b"}] * 501}, 400, "events must be a list of 1 to 500"),
    ({"events": {"type": "a.b"}}, 400, "events must be a list"),
    ({"event": []}, 400, "unknown field(s): event"),
])
def test_one_bad_event_rejects_the_whole_batch(producer, receiver, payload, status, words):
    producer.subscribe(receiver.url + "/ok")
    resp = producer.post("/api/v1/events/batch", payload)
    assert resp.status_code == status and words in resp.get_json()["error"]
    assert counts() == (0, 0)


def test_a_batch_takes_no_idempotency_key(producer):
    resp = producer.post("/api/v1/events/batch", {"events": [{"type": "a.b"}]}, headers={"Idempotency-Key": "k"})
    assert resp.status_code == 400 and "its own id" in resp.get_json()["error"]
    assert counts() == (0, 0)
