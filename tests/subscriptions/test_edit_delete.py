"""PATCH and DELETE /api/v1/subscriptions/<id>, and the edit form and delete button on the page."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.models import Attempt, AuditEntry, Delivery, DeliveryState, Subscription

from tests.support.pipeline import deliver_due

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def patch(producer, sub_id, body):
    return producer.client.patch(f"/api/v1/subscriptions/{sub_id}", json=body, headers=producer.headers())


def test_it_edits_and_the_audit_log_keeps_before_and_after(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/ok", event_types=["file.*"])
    resp = patch(producer, sub["id"], {"url": receiver.url + "/status/200", "event_types": ["file.*", "user.*"],
                                       "event_versions": {"file.updated": 2}, "retry_policy": "quick-then-sweep",
                                       "attempt_timeout": 3, "description": "moved", "rate_limit_per_s": 25,
                                       "max_in_flight": 2})
    assert resp.status_code == 200, resp.get_json()
    body = resp.get_json()
    assert body["url"] == receiver.url + "/status/200" and body["rate_limit_per_s"] == 25.0
    assert body["max_in_flight"] == 2 and body["retry_policy"] == "quick-then-sweep"
    [entry] = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "subscription.edited")).all()
    assert entry.detail["before"]["url"] == receiver.url + "/ok"
    assert entry.detail["after"]["url"] == receiver.url + "/status/200"
    assert entry.detail["before"]["rate_limit_per_s"] is None and entry.detail["after"]["rate_limit_per_s"] == 25.0
    assert "secret" not in str(entry.detail) and sub["secret"] not in str(entry.detail)
    assert "signature_scheme" not in entry.detail["after"]  # only what changed

    producer.publish("user.created", {"resource_id": "u_1"})  # routed by the new types, sent to the new url
    deliver_due(app, clock)
    assert [r.path for r in receiver.requests] == ["/status/200"]
    assert patch(producer, sub["id"], {"rate_limit_per_s": None}).get_json()["rate_limit_per_s"] is None


@sqlite_only
@pytest.mark.parametrize("body, status, words", [
    ({"url": "ftp://example.com/x"}, 400, "url must be an http:// or https:// URL"),
    ({"event_types": []}, 400, "event_types must be a non-empty list"),
    ({"retry_policy": "forever"}, 400, "retry_policy must be one of"),
    ({"attempt_timeout": 60}, 400, "attempt_timeout must be a number from"),
    ({"rate_limit_per_s": 0}, 400, "rate_limit_per_s must be a number from 0.01"),
    ({"rate_limit_per_s": "fast"}, 400, "rate_limit_per_s must be a number"),
    ({"max_in_flight": 0}, 400, "max_in_flight must be a whole number from 1 to 64"),
    ({"max_in_flight": 2.5}, 400, "max_in_flight must be a whole number"),
    ({"signature_scheme": "standard-webhooks"}, 400, "unknown field(s): signature_scheme"),  # receivers verify by it
    ({"secret": "mine"}, 400, "unknown field(s): secret"),
    ({"description": "fine", "url": "https://user:pw@example.com/"}, 422, "credentials"),  # one bad field: nothing is stored
])
def test_it_refuses_a_bad_edit_and_stores_nothing(producer, receiver, body, status, words):
    sub = producer.subscribe(receiver.url + "/ok", description="before")
    resp = patch(producer, sub["id"], body)
    assert resp.status_code == status, resp.get_json()
    assert words in resp.get_json()["error"]
    db.session.expire_all()
    stored = db.session.get(Subscription, sub["id"])
    assert (stored.url, stored.description, stored.rate_limit_per_s) == (receiver.url + "/ok", "before", None)


@sqlite_only
def test_a_private_url_is_refused_on_edit_as_at_creation(app, producer, receiver):
    sub = producer.subscribe(receiver.url + "/ok")
    app.config["PROMESA_ALLOW_PRIVATE_TARGETS"] = False
    resp = patch(producer, sub["id"], {"url": "http://10.1.2.3/hook"})
    assert resp.status_code == 422 and "private" in resp.get_json()["error"]


def test_delete_cancels_what_waits_keeps_the_history_and_sends_nothing_more(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/status/503")
    producer.publish()
    deliver_due(app, clock)  # attempted once, scheduled for a retry
    producer.publish()  # pending
    resp = producer.client.delete(f"/api/v1/subscriptions/{sub['id']}", headers=producer.headers())
    assert resp.status_code == 200 and resp.get_json()["cancelled"] == 2 and resp.get_json()["deleted_at"]
    states = db.session.scalars(select(Delivery.state).where(Delivery.subscription_id == sub["id"])).all()
    assert sorted(states) == [DeliveryState.CANCELLED] * 2
    assert db.session.scalar(select(func.count()).select_from(Attempt)) == 1  # the history stays

    clock.advance(days=2)
    producer.publish()  # routed nowhere: the subscription is out of routing
    deliver_due(app, clock)
    assert receiver.count() == 1
    assert producer.get("/api/v1/subscriptions").get_json()["data"] == []
    assert producer.get(f"/api/v1/subscriptions/{sub['id']}").status_code == 200  # still readable by id
    cancelled = producer.get(f"/api/v1/subscriptions/{sub['id']}/deliveries?state=cancelled").get_json()["data"]
    assert len(cancelled) == 2
    for action in ("resume", "replay", "test", "rotate-secret"):
        assert producer.post(f"/api/v1/subscriptions/{sub['id']}/{action}").status_code == 409, action
    assert patch(producer, sub["id"], {"description": "x"}).status_code == 409
    [entry] = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "subscription.deleted")).all()
    assert entry.deliveries == 2


@sqlite_only
def test_a_delivery_in_flight_when_deleted_ends_cancelled_not_retried(app, producer, receiver, clock):
    from dashboard.delivery import http
    from dashboard.delivery.engine import DeliveryEngine
    from dashboard.delivery.ledger import DrainStats, Finished
    from dashboard.delivery.policies import Outcome
    from dashboard.queue.work import WorkQueue, split_item

    sub = producer.subscribe(receiver.url + "/status/503")
    producer.publish()
    work = WorkQueue.for_app(app)
    engine = DeliveryEngine(app, work, clock)
    [item] = work.pop_ready(10)
    claimed, token = engine.ledger.claim([split_item(item)[1]])  # a worker holds it ...
    producer.client.delete(f"/api/v1/subscriptions/{sub['id']}", headers=producer.headers())
    engine.ledger.record([Finished(claimed[0], token, clock.now(),
                                   http.AttemptResult(Outcome(status_code=503), 5, "no"))],
                         DrainStats())  # ... and its attempt comes back after the delete
    db.session.expire_all()
    delivery = db.session.scalar(select(Delivery))
    assert delivery.state == DeliveryState.CANCELLED and delivery.next_attempt_at is None
    assert db.session.scalar(select(func.count()).select_from(Attempt)) == 1  # ... and its attempt is kept


@sqlite_only
def test_the_edit_form_saves_through_the_same_rules(client, auth, producer, receiver, users):
    sub = producer.subscribe(receiver.url + "/ok", event_versions={"file.updated": 2})
    auth.login("owner")
    form = client.get(f"/subscriptions/{sub['id']}/edit").get_data(as_text=True)
    assert 'value="file.updated=2"' in form
    data = {"csrf_token": auth.csrf(), "url": receiver.url + "/ok", "description": "billing <hook>",
            "event_types": "file.*, user.created", "event_versions": "", "retry_policy": "exponential",
            "connect_timeout": "2", "attempt_timeout": "4", "max_age_seconds": "3600",
            "rate_limit_per_s": "12.5", "max_in_flight": ""}
    resp = client.post(f"/subscriptions/{sub['id']}/edit", data=data)
    assert resp.status_code == 302
    stored = db.session.get(Subscription, sub["id"])
    assert stored.event_types == ["file.*", "user.created"] and stored.event_versions == {}
    assert stored.rate_limit_per_s == 12.5 and stored.max_in_flight is None and stored.attempt_timeout == 4
    html = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    assert "Rate limit: 12.5 deliveries/s across all workers" in html

    bad = client.post(f"/subscriptions/{sub['id']}/edit", data=data | {"attempt_timeout": "99", "description": "no"})
    assert bad.status_code == 400 and "attempt_timeout must be a number from" in bad.get_data(as_text=True)
    assert 'value="no"' in bad.get_data(as_text=True)  # what was typed stays in the form
    db.session.expire_all()
    assert db.session.get(Subscription, sub["id"]).description == "billing <hook>"


@sqlite_only
def test_the_delete_button_asks_twice(client, auth, producer, receiver, users):
    sub = producer.subscribe(receiver.url + "/ok")
    producer.publish()
    auth.login("owner")
    assert "Delete this subscription" in client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    client.post(f"/subscriptions/{sub['id']}/delete", data={"csrf_token": auth.csrf()})  # not ticked
    assert db.session.get(Subscription, sub["id"]).deleted_at is None
    client.post(f"/subscriptions/{sub['id']}/delete", data={"csrf_token": auth.csrf(), "confirm": "yes"})
    db.session.expire_all()
    assert db.session.get(Subscription, sub["id"]).deleted_at is not None
    html = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)  # the page still opens
    assert "nothing more is sent" in html and "Delete this subscription" not in html
    assert "1 waiting delivery was cancelled" in html
    resp = client.post(f"/subscriptions/{sub['id']}/resume", data={"csrf_token": auth.csrf()})
    assert resp.status_code == 302  # refused with a message, not a 500
    assert "this subscription is deleted" in client.get(resp.headers["Location"]).get_data(as_text=True)
    overview = client.get("/").get_data(as_text=True)
    assert sub["id"] not in overview  # out of the list; its page opens by link


@sqlite_only
def test_a_delivery_stored_as_its_subscription_was_deleted_is_held_then_cancelled(app, producer, receiver, clock):
    from dashboard.ingest.accept import ingest_many
    from dashboard.schemas import EventInput
    from dashboard.operations.sweeper import sweep_once

    sub = producer.subscribe(receiver.url + "/ok")
    producer.client.delete(f"/api/v1/subscriptions/{sub['id']}", headers=producer.headers())
    # An ingest that read the routing just before the delete commits, and stores its delivery just after:
    ingest_many(producer.team, [EventInput(type="file.updated")], only=(sub["id"], True))
    deliver_due(app, clock)
    assert receiver.count() == 0  # never sent: the deleted subscription is disabled too
    assert db.session.scalar(select(Delivery.state)) == DeliveryState.HELD
    sweep_once(app)
    db.session.expire_all()
    assert db.session.scalar(select(Delivery.state)) == DeliveryState.CANCELLED


def test_pause_resume_and_delete_lock_their_deliveries_in_id_order(app, producer, receiver):
    """A bulk update of a subscription's deliveries locks them in id order (FOR UPDATE on PostgreSQL), as the
    workers' lease renewal and record do: in another order the two deadlocked, and a delete during the
    isolation fault answered 500."""
    from sqlalchemy import event

    sub = producer.subscribe(receiver.url + "/ok")
    for _ in range(3):
        producer.publish()
    statements: list[str] = []

    def seen(_conn, _cursor, statement, *_args):
        statements.append(statement)

    event.listen(db.engine, "before_cursor_execute", seen)
    try:
        assert producer.post(f"/api/v1/subscriptions/{sub['id']}/pause", {"reason": "maintenance"}).status_code == 200
        assert producer.post(f"/api/v1/subscriptions/{sub['id']}/resume").status_code == 200
        assert producer.client.delete(f"/api/v1/subscriptions/{sub['id']}",
                                      headers=producer.headers()).status_code == 200
    finally:
        event.remove(db.engine, "before_cursor_execute", seen)
    updates = [s for s in statements if s.lstrip().upper().startswith("UPDATE DELIVERIES")]
    assert len(updates) == 3, statements
    locking = "ORDER BY deliveries.id FOR UPDATE" if db.engine.dialect.name == "postgresql" else "ORDER BY deliveries.id"
    assert all(locking in " ".join(s.split()) for s in updates), updates
    states = db.session.scalars(select(Delivery.state).where(Delivery.subscription_id == sub["id"])).all()
    assert states == [DeliveryState.CANCELLED] * 3
