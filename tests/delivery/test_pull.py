"""Pull delivery (issue 40, first part): a pull subscription's client leases due deliveries, verifies them with
the receiver SDK, and acks; no push worker ever sends them. On SQLite and PostgreSQL, with real Redis."""

from __future__ import annotations

import datetime as dt
import threading

from promesa_receiver import verify
from sqlalchemy import select

from dashboard.core.clock import unix
from dashboard.core.extensions import db
from dashboard.delivery import pull as pull_service
from dashboard.models import Attempt, Delivery, DeliveryState, Subscription
from dashboard.operations.sweeper import sweep_once
from dashboard.queue.work import WorkQueue, work_item

from tests.support.pipeline import deliver_due


def pull_subscription(producer, **fields) -> dict:
    resp = producer.post("/api/v1/subscriptions", {"mode": "pull", **fields})
    assert resp.status_code == 201, resp.get_json()
    return resp.get_json()


def pulled(producer, sub, limit=10, lease=30) -> list[dict]:
    resp = producer.get(f"/api/v1/subscriptions/{sub['id']}/pull?limit={limit}&lease={lease}")
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()["data"]


def acked(producer, sub, *entries) -> list[dict]:
    resp = producer.post(f"/api/v1/subscriptions/{sub['id']}/pull/ack", list(entries))
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()["data"]


def answer(item, status, **extra) -> dict:
    return {"delivery_id": item["delivery_id"], "attempt": item["attempt"], "status": status, **extra}


def attempts_of(delivery_id) -> list[Attempt]:
    db.session.expire_all()
    return db.session.scalars(select(Attempt).where(Attempt.delivery_id == delivery_id).order_by(Attempt.number)).all()


def delivery(delivery_id) -> Delivery:
    db.session.expire_all()
    return db.session.get(Delivery, delivery_id)


def test_a_pull_subscription_has_no_url_and_refuses_what_only_a_push_has(producer):
    sub = pull_subscription(producer, event_types=["file.*"], filter={"data.region": "eu"})
    assert (sub["mode"], sub["url"], sub["filter"]) == ("pull", None, {"data.region": "eu"})
    assert producer.get(f"/api/v1/subscriptions/{sub['id']}").get_json()["mode"] == "pull"
    for fields, named in [({"url": "https://example.com/h"}, "url"), ({"headers": {"X-Api-Key": "k"}}, "headers"),
                          ({"rate_limit_per_s": 5}, "rate_limit_per_s"), ({"check": True}, "check")]:
        resp = producer.post("/api/v1/subscriptions", {"mode": "pull", **fields})
        assert resp.status_code == 422 and resp.get_json()["error"].startswith(f"{named}: a pull subscription"), fields
    resp = producer.post("/api/v1/subscriptions", {"event_types": ["*"]})
    assert resp.status_code == 422 and "url" in resp.get_json()["error"]
    resp = producer.client.patch(f"/api/v1/subscriptions/{sub['id']}", json={"url": "https://example.com/h"},
                                 headers=producer.headers())
    assert resp.status_code == 422
    push = producer.subscribe("https://example.com/h")
    assert producer.get(f"/api/v1/subscriptions/{push['id']}/pull").status_code == 409
    assert db.session.scalar(select(Subscription.url).where(Subscription.id == push["id"])) == "https://example.com/h"


def test_a_pulled_delivery_verifies_with_the_sdk_and_an_ack_200_settles_it(app, producer, clock):
    producer.put_consumer("cus_1")
    sub = pull_subscription(producer, consumer="cus_1")
    event = producer.publish(data={"resource_id": "f_1"}, headers={})
    assert event["deliveries"] == 0  # unaddressed: the consumer's endpoint takes only the consumer's events
    event = producer.post("/api/v1/events", {"type": "file.updated", "data": {"resource_id": "f_1"},
                                             "consumer": "cus_1"}).get_json()
    [item] = pulled(producer, sub)
    assert item["attempt"] == 1 and event["id"] in item["body"]
    assert item["headers"]["X-Promesa-Consumer"] == "cus_1"
    assert verify(item["body"].encode(), item["headers"]["X-Signature"], [sub["secret"]], now=unix(clock.now()))
    assert pulled(producer, sub) == []  # leased: nobody else gets it

    clock.advance(2.5)
    [result] = acked(producer, sub, answer(item, 200))
    assert (result["status"], result["state"]) == (200, DeliveryState.SUCCEEDED)
    [attempt] = attempts_of(item["delivery_id"])
    assert (attempt.status_code, attempt.duration_ms, attempt.error) == (200, 2500, None)
    assert acked(producer, sub, answer(item, 200))[0]["status"] == 409  # once only
    assert len(attempts_of(item["delivery_id"])) == 1


def test_an_ack_500_is_retried_on_schedule_then_dead_lettered_and_replayable(app, producer, clock):
    sub = pull_subscription(producer)
    producer.publish()
    for number in range(1, 9):
        [item] = pulled(producer, sub)
        assert item["attempt"] == number
        [result] = acked(producer, sub, answer(item, 500, error="database away"))
        if number < 8:
            due = delivery(item["delivery_id"]).next_attempt_at
            assert result["next_attempt_at"].startswith(due.isoformat()[:19])
            nominal = min(30 * 4 ** (number - 1), 86400)
            assert result["state"] == DeliveryState.SCHEDULED
            assert nominal / 2 <= (due - clock.now()).total_seconds() <= nominal
            clock.set(due - dt.timedelta(seconds=1))
            assert pulled(producer, sub) == []  # not due yet
            clock.set(due)
    assert result["state"] == DeliveryState.DEAD
    attempts = attempts_of(item["delivery_id"])
    assert [(a.status_code, a.response_excerpt) for a in attempts] == [(500, "database away")] * 8

    resp = producer.post(f"/api/v1/subscriptions/{sub['id']}/replay", {})
    assert resp.get_json()["replayed"] == 1
    [again] = pulled(producer, sub)
    assert (again["delivery_id"], again["attempt"]) == (item["delivery_id"], 9)
    assert acked(producer, sub, answer(again, 204))[0]["state"] == DeliveryState.SUCCEEDED


def test_a_lease_that_runs_out_is_a_failed_attempt_and_the_delivery_is_handed_out_again(app, producer, clock):
    sub = pull_subscription(producer)
    producer.publish()
    [first] = pulled(producer, sub, lease=5)
    clock.advance(6)
    sweep_once(app)  # the sweeper records the lease that ran out

    [attempt] = attempts_of(first["delivery_id"])
    assert (attempt.number, attempt.error, attempt.duration_ms) == (1, pull_service.LEASE_EXPIRED, 5000)
    late = acked(producer, sub, answer(first, 200))[0]
    assert late["status"] == 409 and "ran out" in late["error"]
    assert len(attempts_of(first["delivery_id"])) == 1

    clock.set(delivery(first["delivery_id"]).next_attempt_at)
    [second] = pulled(producer, sub, lease=5)
    assert (second["delivery_id"], second["attempt"]) == (first["delivery_id"], 2)
    clock.advance(6)  # this one runs out too, and is recorded by the next pull of the subscription
    [third] = pulled(producer, sub) or [None]
    assert third is None and [a.error for a in attempts_of(first["delivery_id"])] == [pull_service.LEASE_EXPIRED] * 2
    clock.set(delivery(first["delivery_id"]).next_attempt_at)
    [third] = pulled(producer, sub)
    assert acked(producer, sub, answer(second, 200))[0]["status"] == 409  # the lease passed to another client
    assert acked(producer, sub, answer(third, 200))[0]["state"] == DeliveryState.SUCCEEDED
    assert [a.status_code for a in attempts_of(first["delivery_id"])] == [None, None, 200]


def test_the_diagnosis_tells_a_lease_that_ran_out_from_a_failure_the_client_reported(app, producer, clock):
    sub = pull_subscription(producer)
    producer.publish(data={"resource_id": "f_1"})
    producer.publish(data={"resource_id": "f_2"})
    first, second = pulled(producer, sub, lease=5)
    assert acked(producer, sub, answer(first, None, error="disk full"))[0]["status"] == 200
    clock.advance(6)  # the other one is never acknowledged
    sweep_once(app)
    found = producer.get(f"/api/v1/subscriptions/{sub['id']}/diagnosis").get_json()
    groups = {g["cause"]: g for g in found["groups"]}
    assert set(groups) == {"lease_expired", "pull_reported"}, found
    assert "within the lease" in groups["lease_expired"]["advice"]
    assert "disk full" in groups["pull_reported"]["example"]


def test_two_clients_never_get_the_same_delivery_inside_a_lease(app, producer, clock):
    sub = pull_subscription(producer)
    producer.post("/api/v1/events/batch", {"events": [{"type": "file.updated", "data": {"n": n}} for n in range(40)]})
    got: list[list[str]] = [[], []]
    start = threading.Barrier(2)

    def client(index):
        with app.app_context():
            own = db.session.get(Subscription, sub["id"])
            start.wait()
            while batch := pull_service.pull(own, 7, 30):
                got[index] += [p.delivery_id for p in batch]
            db.session.remove()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not set(got[0]) & set(got[1])
    assert len(got[0]) + len(got[1]) == len(set(got[0]) | set(got[1])) == 40


def test_a_paused_pull_subscription_hands_out_nothing(app, producer):
    sub = pull_subscription(producer)
    producer.post(f"/api/v1/subscriptions/{sub['id']}/pause", {"reason": "maintenance"})
    producer.publish()
    assert pulled(producer, sub) == []
    producer.post(f"/api/v1/subscriptions/{sub['id']}/resume")
    assert len(pulled(producer, sub)) == 1
    assert WorkQueue.for_app(app).ready_items() == []  # resuming released it to its client, not to the workers

    producer.put_consumer("cus_1")
    theirs = pull_subscription(producer, consumer="cus_1")
    producer.put_consumer("cus_1", state="disabled")
    producer.post("/api/v1/events", {"type": "file.updated", "data": {}, "consumer": "cus_1"})
    assert pulled(producer, theirs) == []  # nor a disabled consumer's


def test_push_workers_never_attempt_a_pull_delivery(app, producer, clock):
    sub = pull_subscription(producer)
    producer.publish()
    work = WorkQueue.for_app(app)
    assert work.ready_items() == []
    sweep_once(app)
    assert work.ready_items() == []  # due in the database, and not lost: its client pulls it
    dlv = db.session.scalar(select(Delivery.id).where(Delivery.subscription_id == sub["id"]))
    work.push([work_item(sub["id"], dlv)])  # refused at the door too
    assert work.ready_items() == []

    stray = WorkQueue(work.conn, work.prefix, work.rq.name, 1)  # a queue that does not ask (a stray item)
    stray.push([work_item(sub["id"], dlv)])
    assert deliver_due(app, clock) == 0
    assert attempts_of(dlv) == []
    row = delivery(dlv)
    assert (row.state, row.lease_token) == (DeliveryState.PENDING, None)
    assert [p["delivery_id"] for p in pulled(producer, sub)] == [dlv]
