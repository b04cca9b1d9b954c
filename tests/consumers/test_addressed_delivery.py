"""Addressed delivery, end to end with a real receiver: an event for a consumer reaches that consumer's
endpoints and nobody else's; an unaddressed one reaches the team's own endpoints, exactly as before."""

from __future__ import annotations

import json

import sqlalchemy as sa

from dashboard.core.extensions import db
from dashboard.models import Delivery, Event
from tests.conftest import Producer
from tests.support.pipeline import deliver_due


def stored_counts() -> tuple[int, int]:
    db.session.expire_all()
    return (db.session.scalar(sa.select(sa.func.count()).select_from(Event)),
            db.session.scalar(sa.select(sa.func.count()).select_from(Delivery)))


def received(receiver) -> dict[str, list[dict]]:
    """Each path's requests: the body's event and the consumer header."""
    by_path: dict[str, list[dict]] = {}
    for request in receiver.requests:
        by_path.setdefault(request.path, []).append(
            {"id": json.loads(request.body)["id"], "consumer": request.headers.get("X-Promesa-Consumer"),
             "body": json.loads(request.body)})
    return by_path


def two_customers(producer, receiver):
    """Two consumers and the team's own endpoint, all for the same event types."""
    producer.put_consumer("cus_alice", name="Alice")
    producer.put_consumer("cus_bob", name="Bob")
    producer.subscribe(receiver.url + "/ok/alice", event_types=["invoice.*"], consumer="cus_alice")
    producer.subscribe(receiver.url + "/ok/bob", event_types=["invoice.*"], consumer="cus_bob")
    producer.subscribe(receiver.url + "/ok/team", event_types=["invoice.*"])


def test_two_consumers_with_the_same_types_each_receive_only_their_own_events(app, producer, receiver, clock):
    two_customers(producer, receiver)
    alice = [producer.publish("invoice.paid", {"resource_id": f"in_a{n}"}) for n in range(2)]
    for n in range(2):
        resp = producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": "cus_alice",
                                                "data": {"resource_id": f"in_a{n}"}})
        assert resp.status_code == 202 and resp.get_json()["deliveries"] == 1, resp.get_json()
        alice.append(resp.get_json())
    bob = producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": "cus_bob",
                                           "data": {"resource_id": "in_b0"}}).get_json()
    assert bob["deliveries"] == 1

    deliver_due(app, clock)

    got = received(receiver)
    assert sorted(r["id"] for r in got["/ok/alice"]) == sorted(a["id"] for a in alice[2:])
    assert [r["id"] for r in got["/ok/bob"]] == [bob["id"]]
    # The unaddressed ones went to the team's own endpoint alone.
    assert sorted(r["id"] for r in got["/ok/team"]) == sorted(a["id"] for a in alice[:2])
    assert {r["consumer"] for r in got["/ok/alice"]} == {"cus_alice"}
    assert {r["consumer"] for r in got["/ok/bob"]} == {"cus_bob"}
    assert {r["consumer"] for r in got["/ok/team"]} == {None}
    # The signed body is the same thin event: nothing about the consumer in it.
    assert set(got["/ok/alice"][0]["body"]) == {"id", "type", "version", "timestamp", "data"}


def test_a_batch_addresses_each_event_to_its_own_consumer(app, producer, receiver, clock):
    two_customers(producer, receiver)
    db.session.remove()  # as under gunicorn: on PostgreSQL ingest then reads and writes on its own connection
    resp = producer.post("/api/v1/events/batch", {"events": [
        {"type": "invoice.paid", "consumer": "cus_alice", "id": "a1", "data": {"resource_id": "in_1"}},
        {"type": "invoice.paid", "consumer": "cus_bob", "id": "b1", "data": {"resource_id": "in_2"}},
        {"type": "invoice.voided", "consumer": "cus_bob", "id": "b2", "data": {"resource_id": "in_3"}},
        {"type": "invoice.paid", "id": "t1", "data": {"resource_id": "in_4"}},
    ]})
    assert resp.status_code == 202, resp.get_json()
    assert [a["deliveries"] for a in resp.get_json()["data"]] == [1, 1, 1, 1]

    deliver_due(app, clock)

    got = received(receiver)
    assert sorted(r["id"] for r in got["/ok/alice"]) == ["a1"]
    assert sorted(r["id"] for r in got["/ok/bob"]) == ["b1", "b2"]
    assert sorted(r["id"] for r in got["/ok/team"]) == ["t1"]
    events = {e.id: e.consumer_id for e in db.session.scalars(sa.select(Event))}
    assert events["t1"] is None and events["a1"] != events["b1"] == events["b2"]


def test_a_batch_of_one_consumer_and_one_type_takes_the_single_read_and_routes_the_same(app, producer, receiver,
                                                                                        clock):
    two_customers(producer, receiver)
    resp = producer.post("/api/v1/events/batch", {"events": [
        {"type": "invoice.paid", "consumer": "cus_bob", "data": {"resource_id": f"in_{n}"}} for n in range(3)]})
    assert [a["deliveries"] for a in resp.get_json()["data"]] == [1, 1, 1]
    deliver_due(app, clock)
    assert set(received(receiver)) == {"/ok/bob"} and receiver.count("/ok/bob") == 3


def test_an_unknown_uid_gets_a_422_naming_it_and_nothing_is_stored(app, producer, receiver):
    two_customers(producer, receiver)
    before = stored_counts()
    resp = producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": "cus_nobody", "data": {}})
    assert resp.status_code == 422 and "cus_nobody" in resp.get_json()["error"], resp.get_json()
    # A batch is all or nothing: one unknown uid refuses the events addressed to known ones too.
    resp = producer.post("/api/v1/events/batch", {"events": [
        {"type": "invoice.paid", "consumer": "cus_alice", "data": {}},
        {"type": "invoice.paid", "data": {}},
        {"type": "invoice.paid", "consumer": "cus_nobody", "data": {}}]})
    assert resp.status_code == 422, resp.get_json()
    assert resp.get_json()["error"].startswith("events[2]: ") and "cus_nobody" in resp.get_json()["error"]
    assert stored_counts() == before


def test_a_consumer_without_an_endpoint_gets_its_event_kept_with_no_delivery(app, producer, receiver):
    producer.put_consumer("cus_new")
    producer.subscribe(receiver.url + "/ok/team")
    accepted = producer.post("/api/v1/events", {"type": "file.updated", "consumer": "cus_new", "data": {}})
    assert accepted.status_code == 202 and accepted.get_json()["deliveries"] == 0
    event = producer.get(f"/api/v1/events/{accepted.get_json()['id']}").get_json()
    assert event["consumer"] == "cus_new" and event["deliveries"] == []


def test_another_team_can_neither_address_nor_read_this_teams_consumers(app, client, producer, receiver):
    producer.put_consumer("cus_alice")
    producer.subscribe(receiver.url + "/ok/alice", consumer="cus_alice")
    other = Producer(client, team_name="other")
    other.subscribe(receiver.url + "/ok/other")
    assert other.get("/api/v1/consumers/cus_alice").status_code == 404
    assert other.client.delete("/api/v1/consumers/cus_alice", headers=other.headers()).status_code == 404
    assert "cus_alice" not in json.dumps(other.get("/api/v1/consumers").get_json())
    resp = other.post("/api/v1/events", {"type": "file.updated", "consumer": "cus_alice", "data": {}})
    assert resp.status_code == 422 and "cus_alice" in resp.get_json()["error"]
    resp = other.post("/api/v1/subscriptions", {"url": receiver.url + "/ok/x", "consumer": "cus_alice"})
    assert resp.status_code == 422 and "cus_alice" in resp.get_json()["error"]
    # The same uid in the other team is the other team's own consumer: still never this one's endpoints.
    other.put_consumer("cus_alice")
    resp = other.post("/api/v1/events", {"type": "file.updated", "consumer": "cus_alice", "data": {}})
    assert resp.status_code == 202 and resp.get_json()["deliveries"] == 0


def test_a_disabled_consumer_holds_new_events_until_it_is_enabled(app, producer, receiver, clock):
    two_customers(producer, receiver)
    producer.put_consumer("cus_alice", state="disabled")
    accepted = producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": "cus_alice", "data": {}})
    assert accepted.get_json()["deliveries"] == 1
    deliver_due(app, clock)
    assert receiver.count() == 0
    assert db.session.scalar(sa.select(Delivery.state)) == "held"
    producer.put_consumer("cus_alice", state="active")
    deliver_due(app, clock)
    assert [r["id"] for r in received(receiver)["/ok/alice"]] == [accepted.get_json()["id"]]


def test_deleting_a_consumer_holds_back_nothing_already_accepted(app, producer, receiver, clock):
    two_customers(producer, receiver)
    producer.put_consumer("cus_alice", state="disabled")
    held = producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": "cus_alice", "data": {}}).get_json()
    producer.put_consumer("cus_alice", state="active")
    pending = producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": "cus_alice", "data": {}}).get_json()
    producer.put_consumer("cus_alice", state="disabled")
    resp = producer.client.delete("/api/v1/consumers/cus_alice", headers=producer.headers())
    assert resp.status_code == 200, resp.get_json()
    # Out of routing: its uid names no consumer now.
    assert producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": "cus_alice",
                                            "data": {}}).status_code == 422
    deliver_due(app, clock)
    assert sorted(r["id"] for r in received(receiver)["/ok/alice"]) == sorted([held["id"], pending["id"]])
    # A new consumer with the same uid is another party: none of the old one's endpoints.
    assert producer.put_consumer("cus_alice")["subscriptions"] == 0
    assert producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": "cus_alice",
                                            "data": {}}).get_json()["deliveries"] == 0
