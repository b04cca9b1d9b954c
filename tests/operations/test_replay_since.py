""""Replay since" (recover) for a consumer, as a job with progress (SQLite and PostgreSQL, real Redis, real RQ
worker, real receiver): a consumer's events accepted before its endpoint existed reach it, each once, only its own
and only since the time; dead ones are sent again, delivered ones are not; a second start finds the running one."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from sqlalchemy import select, update

from dashboard.core.clock import iso
from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Delivery, Event, Replay, Subscription
from dashboard.operations import replays
from dashboard.queue import lanes

from tests.support.pipeline import deliver_due, run_worker


@pytest.fixture(autouse=True)
def _small_chunks(app):
    app.config["PROMESA_REPLAY_CHUNK"] = 2
    app.config["PROMESA_DRAIN_LINGER_SECONDS"] = 0.0


def addressed(producer, uid, event_type="invoice.paid"):
    resp = producer.post("/api/v1/events", {"type": event_type, "consumer": uid, "data": {"resource_id": "i_1"}})
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()


def received(receiver, path):
    """The event ids that reached `path`, in arrival order (repeats kept), and the consumer header each carried."""
    hits = [r for r in receiver.requests if r.path == path]
    return [json.loads(r.body)["id"] for r in hits], {r.headers.get("X-Promesa-Consumer") for r in hits}


def replay_since(producer, uid, subscription_id, since):
    return producer.post(f"/api/v1/consumers/{uid}/replay-since", {"subscription_id": subscription_id, "since": since})


def test_events_accepted_before_the_endpoint_existed_reach_it_once_each_only_its_own_and_only_since(
        app, producer, receiver, clock):
    producer.put_consumer("alice")
    producer.put_consumer("bob")
    bobs = producer.subscribe(receiver.url + "/ok/bob", event_types=["invoice.*"], consumer="bob")
    producer.subscribe(receiver.url + "/ok/team", event_types=["invoice.*"])
    before = addressed(producer, "alice")["id"]  # accepted before the time asked for: stays unsent
    clock.advance(minutes=5)
    since = iso(clock.now())
    late = [addressed(producer, "alice") for _ in range(3)]
    assert [a["deliveries"] for a in late] == [0, 0, 0]  # alice has no endpoint yet: kept, delivered to nobody
    bob_event = addressed(producer, "bob")["id"]
    producer.publish("invoice.paid")  # unaddressed: the team's own endpoint
    clock.advance(minutes=5)
    alices = producer.subscribe(receiver.url + "/ok/alice", event_types=["invoice.*"], consumer="alice")
    routed = addressed(producer, "alice")["id"]  # after the endpoint: routed to it by ingest, delivered once
    addressed(producer, "alice", "file.updated")  # a type alice's endpoint does not take: never sent to it
    deliver_due(app, clock)
    assert received(receiver, "/ok/alice")[0] == [routed]

    resp = replay_since(producer, "alice", alices["id"], since)
    assert resp.status_code == 202, resp.get_json()
    started = resp.get_json()
    assert started["total"] == 3 and started["duplicate"] is False and started["held_until_resume"] is False
    again = replay_since(producer, "alice", alices["id"], since).get_json()
    assert again["id"] == started["id"] and again["duplicate"] is True  # queued: the second start finds it
    assert lanes.queue("repairs", app).job_ids.count(f"replay-{started['id']}") == 1

    run_worker(app)  # the job, in chunks of 2, then the drain jobs it started
    alice_ids, alice_headers = received(receiver, "/ok/alice")
    assert sorted(alice_ids) == sorted([routed, *(a["id"] for a in late)])  # each exactly once; not `before`
    assert before not in alice_ids and bob_event not in alice_ids and alice_headers == {"alice"}
    assert received(receiver, "/ok/bob") == ([bob_event], {"bob"})  # the other consumer's event never went
    assert len(received(receiver, "/ok/team")[0]) == 1  # the team's own endpoint: its unaddressed event alone
    replay = db.session.get(Replay, started["id"])
    assert (replay.kind, replay.state, replay.total, replay.done) == ("recover", "finished", 3, 3)
    assert replay.filter["consumer"] == "alice" and replay.subscription_id == alices["id"]
    progress = producer.get(f"/api/v1/replays/{replay.id}").get_json()
    assert (progress["kind"], progress["progress"], progress["succeeded"], progress["waiting"]) == \
        ("recover", "finished", 3, 0)
    assert bobs["id"] not in {d.subscription_id for d in db.session.scalars(
        select(Delivery).where(Delivery.replay_id == replay.id))}

    # Nothing is owed any more: a new one matches nothing and ends at once, sending nothing.
    resp = replay_since(producer, "alice", alices["id"], since).get_json()
    assert (resp["total"], resp["state"], resp["duplicate"]) == (0, "finished", False)
    run_worker(app)
    assert len(received(receiver, "/ok/alice")[0]) == 4
    assert db.session.scalar(select(AuditEntry).where(AuditEntry.action == "recover.started",
                                                      AuditEntry.target == f"replay:{replay.id}")) is not None


def test_dead_ones_are_sent_again_and_delivered_ones_left_alone(app, producer, receiver, clock):
    producer.put_consumer("alice")
    alices = producer.subscribe(receiver.url + "/status/400", event_types=["invoice.*"], consumer="alice")
    doomed = [addressed(producer, "alice")["id"] for _ in range(3)]
    for _ in range(3):  # 4xx: three attempts, then dead letters
        deliver_due(app, clock)
        clock.advance(hours=1)
    db.session.execute(update(Subscription).where(Subscription.id == alices["id"])
                       .values(url=receiver.url + "/ok/alice"))
    db.session.commit()
    fine = addressed(producer, "alice")["id"]
    deliver_due(app, clock)
    assert received(receiver, "/ok/alice")[0] == [fine]

    sub = db.session.get(Subscription, alices["id"])
    replay, started = replays.start_recover(sub.consumer, sub, clock.now() - dt.timedelta(days=1))
    assert started and replay.total == 3
    run_worker(app)
    alice_ids, _ = received(receiver, "/ok/alice")
    assert sorted(alice_ids) == sorted([fine, *doomed])  # the delivered one was not sent again
    states = dict(db.session.execute(select(Event.id, Delivery.state).join(Delivery.event)
                                     .where(Delivery.subscription_id == alices["id"])).all())
    assert set(states.values()) == {"succeeded"} and len(states) == 4


def test_it_refuses_what_is_not_the_consumers(app, producer, receiver, clock):
    producer.put_consumer("alice")
    producer.put_consumer("bob")
    bobs = producer.subscribe(receiver.url + "/ok/bob", consumer="bob")
    alices = producer.subscribe(receiver.url + "/ok/alice", consumer="alice")
    since = iso(clock.now())
    refused = replay_since(producer, "alice", bobs["id"], since)
    assert refused.status_code == 422 and bobs["id"] in json.dumps(refused.get_json())
    assert replay_since(producer, "nobody", alices["id"], since).status_code == 404
    assert replay_since(producer, "alice", alices["id"], "yesterday").status_code in (400, 422)
    assert producer.client.delete(f"/api/v1/subscriptions/{alices['id']}", headers=producer.headers()).status_code \
        in (200, 204)
    assert replay_since(producer, "alice", alices["id"], since).status_code == 409
    assert db.session.scalar(select(Replay.id)) is None


def test_to_a_disabled_consumer_it_is_held_until_enabled(app, producer, receiver, clock):
    producer.put_consumer("alice")
    since = iso(clock.now())
    owed = [addressed(producer, "alice")["id"] for _ in range(3)]
    alices = producer.subscribe(receiver.url + "/ok/alice", consumer="alice")
    producer.put_consumer("alice", state="disabled")
    started = replay_since(producer, "alice", alices["id"], since).get_json()
    assert started["total"] == 3 and started["held_until_resume"] is True
    run_worker(app)
    deliver_due(app, clock)
    assert received(receiver, "/ok/alice")[0] == []
    progress = producer.get(f"/api/v1/replays/{started['id']}").get_json()
    assert (progress["state"], progress["held"], progress["progress"]) == ("finished", 3, "held until resume")
    producer.put_consumer("alice", state="active")
    deliver_due(app, clock)
    assert sorted(received(receiver, "/ok/alice")[0]) == sorted(owed)


def test_the_openapi_document_declares_it(producer):
    doc = producer.get("/api/v1/openapi.json").get_json()
    [path] = [p for p in doc["paths"] if p.endswith("/replay-since")]
    post = doc["paths"][path]["post"]
    assert "202" in post["responses"] and {"409", "422"} <= set(post["responses"])
    assert "requestBody" in post
