"""Listen sessions (issue 40): the temporary pull subscriptions `promesa-receiver listen` makes. Made through the
API as any subscription (the team's token, its quota), marked seen by their pulls, shown as what they are, and
deleted by the sweeper once idle. On SQLite and PostgreSQL, with real Redis; time moves by the test's clock."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.ingest import quotas
from dashboard.models import LISTEN_TARGET, AuditEntry, Delivery, DeliveryState, Subscription
from dashboard.operations.sweeper import sweep_once

from tests.conftest import Producer

IDLE = 600  # PROMESA_LISTEN_IDLE_SECONDS' default


def listen_session(producer, **fields) -> dict:
    resp = producer.post("/api/v1/subscriptions", {"mode": "pull", "listen": True, **fields})
    assert resp.status_code == 201, resp.get_json()
    return resp.get_json()


def stored(subscription_id) -> Subscription:
    db.session.expire_all()
    return db.session.get(Subscription, subscription_id)


def test_a_listen_session_is_a_pull_subscription_the_api_marks_and_refuses_otherwise(producer, clock):
    session = listen_session(producer, event_types=["invoice.*"])
    assert (session["mode"], session["listen"], session["url"]) == ("pull", True, None)
    assert session["listen_seen_at"].startswith(clock.now().isoformat(timespec="milliseconds"))
    assert session["secret"].startswith("whsec_")
    assert producer.get(f"/api/v1/subscriptions/{session['id']}").get_json()["listen"] is True
    plain = producer.post("/api/v1/subscriptions", {"mode": "pull"}).get_json()
    assert (plain["listen"], plain["listen_seen_at"]) == (False, None)
    listed = {s["id"]: s["listen"] for s in producer.get("/api/v1/subscriptions").get_json()["data"]}
    assert listed == {session["id"]: True, plain["id"]: False}
    entry = db.session.scalar(select(AuditEntry).where(AuditEntry.subscription_id == session["id"]))
    assert entry.detail == {"mode": "pull", "listen": True}

    for payload in ({"listen": True}, {"listen": True, "url": "https://example.com/h"},
                    {"listen": True, "mode": "push", "url": "https://example.com/h"}):
        resp = producer.post("/api/v1/subscriptions", payload)
        assert resp.status_code == 422, payload
        assert resp.get_json()["error"].startswith('listen: only a pull subscription ("mode": "pull")'), payload
    resp = producer.client.patch(f"/api/v1/subscriptions/{plain['id']}", json={"listen": True},
                                 headers=producer.headers())
    assert resp.status_code == 400 and "listen" in resp.get_json()["error"]  # never made one later
    assert db.session.scalar(select(Subscription.id).where(Subscription.id.not_in([session["id"], plain["id"]]))) is None
    assert stored(plain["id"]).listen_seen_at is None


def test_listen_sessions_count_against_the_subscriptions_quota(producer, receiver):
    quotas.set_override(producer.team, "subscriptions", 2, actor=("system", "test"))
    producer.subscribe(receiver.url + "/ok")
    session = listen_session(producer)
    resp = producer.post("/api/v1/subscriptions", {"mode": "pull", "listen": True})
    assert resp.status_code == 409 and resp.get_json()["quota"] == "subscriptions"
    assert "has its 2 subscriptions" in resp.get_json()["error"]
    assert producer.client.delete(f"/api/v1/subscriptions/{session['id']}", headers=producer.headers()).status_code == 200
    listen_session(producer)  # the ended session's room is free again


def test_a_listen_session_belongs_to_its_tokens_team(producer, client):
    session = listen_session(producer)
    other = Producer(client, team_name="other")
    for method, path in [("GET", ""), ("GET", "/pull"), ("DELETE", "")]:
        resp = other.client.open(f"/api/v1/subscriptions/{session['id']}{path}", method=method, headers=other.headers())
        assert resp.status_code == 404, (method, path)
    assert stored(session["id"]).deleted_at is None
    resp = producer.post("/api/v1/subscriptions", {"mode": "pull", "listen": True, "consumer": "cus_unknown"})
    assert resp.status_code == 422  # a consumer of its own team only


def test_each_pull_marks_the_session_seen_at_most_every_few_seconds(producer, clock):
    session = listen_session(producer)
    created = stored(session["id"]).listen_seen_at
    clock.advance(4)
    assert producer.get(f"/api/v1/subscriptions/{session['id']}/pull").status_code == 200
    assert stored(session["id"]).listen_seen_at == created  # seen 4 s ago: not written again
    clock.advance(2)
    producer.get(f"/api/v1/subscriptions/{session['id']}/pull")
    assert stored(session["id"]).listen_seen_at == clock.now()
    producer.post(f"/api/v1/subscriptions/{session['id']}/pause")
    clock.advance(10)
    assert producer.get(f"/api/v1/subscriptions/{session['id']}/pull").get_json()["data"] == []
    assert stored(session["id"]).listen_seen_at == clock.now()  # paused, yet its client is alive


def test_the_sweeper_deletes_an_idle_session_as_the_api_would_and_nothing_else(app, producer, clock):
    idle = listen_session(producer)
    recent = listen_session(producer)
    plain = producer.post("/api/v1/subscriptions", {"mode": "pull"}).get_json()
    producer.publish()  # one delivery owed to each
    clock.advance(IDLE - 1)
    producer.get(f"/api/v1/subscriptions/{recent['id']}/pull?lease=300")  # its client is alive: it pulls
    sweep_once(app)
    assert stored(idle["id"]).deleted_at is None  # idle for one second less than allowed

    clock.advance(2)
    sweep_once(app)
    gone = stored(idle["id"])
    assert gone.deleted_at == clock.now() and gone.state_reason == "deleted"
    assert stored(recent["id"]).deleted_at is None and stored(plain["id"]).deleted_at is None
    entry = db.session.scalar(select(AuditEntry).where(AuditEntry.subscription_id == idle["id"],
                                                       AuditEntry.action == "subscription.deleted"))
    assert (entry.actor_kind, entry.actor, entry.deliveries) == ("system", "system", 1)
    assert entry.detail["reason"].startswith(f"listen session idle: not pulled for {IDLE} seconds")
    states = dict(db.session.execute(select(Delivery.subscription_id, Delivery.state)).all())
    assert states[idle["id"]] == DeliveryState.CANCELLED
    assert states[plain["id"]] == DeliveryState.PENDING and states[recent["id"]] != DeliveryState.CANCELLED
    assert producer.get(f"/api/v1/subscriptions/{idle['id']}/pull").status_code == 409  # its client is told

    app.config["PROMESA_LISTEN_IDLE_SECONDS"] = 30
    clock.advance(31)
    sweep_once(app)
    assert stored(recent["id"]).deleted_at == clock.now() and stored(plain["id"]).deleted_at is None


def test_pages_say_a_listen_session_is_temporary(app, client, auth, producer, users, clock):
    session = listen_session(producer, description="laptop")
    plain = producer.post("/api/v1/subscriptions", {"mode": "pull"}).get_json()
    event = producer.publish()
    clock.advance(90)
    auth.login("owner")
    page = client.get(f"/subscriptions/{session['id']}").get_data(as_text=True)
    assert f"<h1>{LISTEN_TARGET}</h1>" in page
    assert "last seen" in page and "(1 min ago)" in page and "the sweeper deletes it after 10 min without a pull" in page
    assert "Listen session" not in client.get(f"/subscriptions/{plain['id']}").get_data(as_text=True)
    assert LISTEN_TARGET in client.get("/").get_data(as_text=True)
    delivery_id = db.session.scalar(select(Delivery.id).where(Delivery.subscription_id == session["id"]))
    assert LISTEN_TARGET in client.get(f"/deliveries/{delivery_id}").get_data(as_text=True)
    where_it_went = client.get(f"/events/{event['id']}?team=acme").get_data(as_text=True)
    assert LISTEN_TARGET in where_it_went and "pull: fetched by the receiver" in where_it_went
    producer.client.delete(f"/api/v1/subscriptions/{session['id']}", headers=producer.headers())
    ended = client.get(f"/subscriptions/{session['id']}").get_data(as_text=True)
    assert "temporary, made by <code>promesa-receiver listen</code></dd>" in ended and "last seen" not in ended


def test_the_openapi_document_shows_listen(client):
    schemas = client.get("/api/v1/openapi.json").get_json()["components"]["schemas"]
    assert schemas["SubscriptionInput"]["properties"]["listen"]["type"] == "boolean"
    assert {"listen", "listen_seen_at"} <= set(schemas["Subscription"]["required"])
    assert "listen" not in schemas["SubscriptionEdit"]["properties"]  # a session is one from its creation on
