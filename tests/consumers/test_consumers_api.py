"""The consumers API: PUT, GET, DELETE /api/v1/consumers/<uid> and GET /api/v1/consumers, the consumer a
subscription belongs to, the quotas that bound them, and the audit log of every change."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.ingest import quotas
from dashboard.models import AuditEntry, Consumer, Event, Subscription

from tests.conftest import Producer

ADMIN = ("user", "admin@example.com")


def put(producer, uid, body=None, **kwargs):
    return producer.client.put(f"/api/v1/consumers/{uid}", json=body, headers=producer.headers(), **kwargs)


def delete(producer, uid):
    return producer.client.delete(f"/api/v1/consumers/{uid}", headers=producer.headers())


def actions(target):
    return db.session.scalars(select(AuditEntry.action).where(AuditEntry.target == target)
                              .order_by(AuditEntry.id)).all()


def count(model):
    return db.session.scalar(select(func.count()).select_from(model))


# -- PUT ----------------------------------------------------------------------------------------------
def test_put_creates_then_updates_and_is_idempotent(producer):
    created = put(producer, "cus_8812", {"name": "Acme Corp", "metadata": {"plan": "pro"}})
    assert created.status_code == 201, created.get_json()
    body = created.get_json()
    assert body["uid"] == "cus_8812" and body["name"] == "Acme Corp" and body["metadata"] == {"plan": "pro"}
    assert body["state"] == "active" and body["subscriptions"] == 0 and body["deleted_at"] is None

    again = put(producer, "cus_8812", {"name": "Acme Corp", "metadata": {"plan": "pro"}})
    assert again.status_code == 200 and again.get_json() == body  # nothing changed, not even updated_at
    assert actions("consumer:cus_8812") == ["consumer.created"]

    renamed = put(producer, "cus_8812", {"name": "Acme Inc"}).get_json()
    assert renamed["name"] == "Acme Inc" and renamed["metadata"] == {"plan": "pro"}  # absent fields keep theirs
    cleared = put(producer, "cus_8812", {"metadata": None}).get_json()
    assert cleared["metadata"] is None and cleared["name"] == "Acme Inc"
    assert put(producer, "cus_8812").status_code == 200  # no body: nothing to change
    assert count(Consumer) == 1
    assert actions("consumer:cus_8812") == ["consumer.created", "consumer.edited", "consumer.edited"]


def test_put_disables_and_enables_and_the_log_says_so(producer):
    put(producer, "cus_1")
    disabled = put(producer, "cus_1", {"state": "disabled"})
    assert disabled.status_code == 200 and disabled.get_json()["state"] == "disabled"
    assert put(producer, "cus_1", {"state": "disabled"}).status_code == 200  # already: no second entry
    assert put(producer, "cus_1", {"state": "active"}).get_json()["state"] == "active"
    assert actions("consumer:cus_1") == ["consumer.created", "consumer.disabled", "consumer.enabled"]
    entry = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "consumer.disabled"))
    assert entry.team_id == producer.team.id and entry.actor_kind == "token"


def test_a_consumer_may_be_created_disabled(producer):
    assert put(producer, "cus_1", {"state": "disabled"}).get_json()["state"] == "disabled"


def test_metadata_is_capped(producer):
    resp = put(producer, "cus_1", {"metadata": {"notes": "x" * 5000}})
    assert resp.status_code == 413 and "4096 bytes" in resp.get_json()["error"]
    assert count(Consumer) == 0
    put(producer, "cus_1", {"metadata": {"plan": "pro"}})
    assert put(producer, "cus_1", {"metadata": {"notes": "x" * 5000}}).status_code == 413
    assert producer.get("/api/v1/consumers/cus_1").get_json()["metadata"] == {"plan": "pro"}


@pytest.mark.parametrize("body", [{"metadata": [1, 2]}, {"metadata": "plan=pro"}, {"metadata": 7}])
def test_metadata_must_be_an_object(producer, body):
    resp = put(producer, "cus_1", body)
    assert resp.status_code == 400 and "metadata must be a JSON object" in resp.get_json()["error"]
    assert count(Consumer) == 0


@pytest.mark.parametrize("body, words", [
    ({"state": "paused"}, "state must be one of: active, disabled"),
    ({"name": "x" * 201}, "name must be a string of at most 200 characters"),
    ({"uid": "other"}, "unknown field(s): uid"),
])
def test_bad_fields_are_refused_and_nothing_is_stored(producer, body, words):
    resp = put(producer, "cus_1", body)
    assert resp.status_code == 400 and words in resp.get_json()["error"], resp.get_json()
    assert count(Consumer) == 0


@pytest.mark.parametrize("uid", ["cus 1", "cüs", "cus%241", "cus,1", "x" * 101])
def test_a_uid_outside_the_rule_is_refused_naming_it(producer, uid):
    resp = put(producer, uid, {"name": "n"})
    assert resp.status_code == 422, resp.get_json()
    assert "1 to 100 letters, digits, '.', '_', ':' or '-'" in resp.get_json()["error"]
    assert count(Consumer) == 0


def test_every_character_of_the_rule_and_100_of_them_are_a_uid(producer):
    for uid in ("A-z_0.9:x", "x" * 100):
        assert put(producer, uid).status_code == 201
        assert producer.get(f"/api/v1/consumers/{uid}").get_json()["uid"] == uid


# -- GET, DELETE, and another team --------------------------------------------------------------------
def test_get_answers_the_consumer_with_its_subscription_count(producer, receiver):
    put(producer, "cus_1", {"name": "One"})
    producer.subscribe(receiver.url + "/a", consumer="cus_1")
    producer.subscribe(receiver.url + "/b")  # the team's own: not counted
    body = producer.get("/api/v1/consumers/cus_1").get_json()
    assert body["name"] == "One" and body["subscriptions"] == 1
    missing = producer.get("/api/v1/consumers/cus_2")
    assert missing.status_code == 404 and "cus_2" in missing.get_json()["error"]


def test_another_team_can_neither_read_nor_address_this_teams_consumers(client, producer, receiver):
    put(producer, "cus_1", {"name": "Acme's customer"})
    producer.subscribe(receiver.url + "/a", consumer="cus_1")
    other = Producer(client, team_name="other")
    for resp in (other.get("/api/v1/consumers/cus_1"), delete(other, "cus_1")):
        assert resp.status_code == 404 and "no consumer 'cus_1'" in resp.get_json()["error"]
    assert other.get("/api/v1/consumers").get_json() == {"data": [], "next_after": None}
    event = other.post("/api/v1/events", {"type": "file.updated", "data": {"resource_id": "f_1"},
                                          "consumer": "cus_1"})
    assert event.status_code == 422 and "cus_1" in event.get_json()["error"]
    sub = other.post("/api/v1/subscriptions", {"url": receiver.url + "/b", "consumer": "cus_1"})
    assert sub.status_code == 422 and "cus_1" in sub.get_json()["error"]
    assert count(Event) == 0 and count(Subscription) == 1
    # The same uid in the other team is its own consumer, apart from this one.
    assert put(other, "cus_1", {"name": "Other's"}).status_code == 201
    assert producer.get("/api/v1/consumers/cus_1").get_json()["name"] == "Acme's customer"


# -- the list -----------------------------------------------------------------------------------------
def test_the_list_pages_by_uid_with_after(producer):
    uids = ["b", "a", "c:1", "c.2", "c-3", "C", "d_4"]
    for uid in uids:
        put(producer, uid)
    seen, after = [], None
    while True:
        query = {"limit": 3} | ({"after": after} if after else {})
        page = producer.get("/api/v1/consumers", query_string=query).get_json()
        assert len(page["data"]) <= 3
        seen += [c["uid"] for c in page["data"]]
        after = page["next_after"]
        if after is None:
            break
    assert seen == sorted(uids, key=lambda u: u.encode())  # byte order: "C" before "a", "-" before "." and ":"


def test_the_prefix_filter_is_exact_in_byte_order(producer):
    for uid in ("cus_1", "cus_10", "cus_2", "Cus_3", "cus-4", "cu", "cus"):
        put(producer, uid)
    listed = lambda **q: [c["uid"] for c in producer.get("/api/v1/consumers", query_string=q).get_json()["data"]]
    assert listed(prefix="cus_") == ["cus_1", "cus_10", "cus_2"]
    assert listed(prefix="cus_1") == ["cus_1", "cus_10"]
    assert listed(prefix="Cus") == ["Cus_3"]  # case counts
    assert listed(prefix="cus") == ["cus", "cus-4", "cus_1", "cus_10", "cus_2"]
    assert listed(prefix="cus_", limit=1, after="cus_1") == ["cus_10"]
    assert listed(prefix="zz") == []


@pytest.mark.parametrize("query, words", [
    ({"limit": 0}, "limit must be a whole number from 1 to 100"),
    ({"limit": 101}, "limit must be a whole number from 1 to 100"),
    ({"prefix": "a b"}, "prefix must be the start of a consumer uid"),
    ({"after": "a/b"}, "after must be a consumer uid"),
])
def test_bad_list_queries_are_refused(producer, query, words):
    resp = producer.get("/api/v1/consumers", query_string=query)
    assert resp.status_code == 400 and words in resp.get_json()["error"], resp.get_json()


# -- DELETE -------------------------------------------------------------------------------------------
def test_delete_is_soft_and_takes_its_subscriptions_with_it(producer, receiver):
    put(producer, "cus_1", {"name": "Old"})
    mine = producer.subscribe(receiver.url + "/a", consumer="cus_1")
    own = producer.subscribe(receiver.url + "/team")
    resp = delete(producer, "cus_1")
    assert resp.status_code == 200, resp.get_json()
    body = resp.get_json()
    assert body["uid"] == "cus_1" and body["deleted_at"] is not None and body["released"] == 0
    assert producer.get("/api/v1/consumers/cus_1").status_code == 404
    assert delete(producer, "cus_1").status_code == 404
    assert producer.get("/api/v1/consumers").get_json()["data"] == []
    listed = [s["id"] for s in producer.get("/api/v1/subscriptions").get_json()["data"]]
    assert listed == [own["id"]]
    assert producer.get(f"/api/v1/subscriptions/{mine['id']}").get_json()["deleted_at"] is not None
    event = producer.post("/api/v1/events", {"type": "file.updated", "data": {}, "consumer": "cus_1"})
    assert event.status_code == 422 and "cus_1" in event.get_json()["error"]
    assert actions("consumer:cus_1") == ["consumer.created", "consumer.deleted"]
    deleted = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "consumer.deleted"))
    assert deleted.detail == {"subscriptions": 1}

    again = put(producer, "cus_1", {"name": "New"})
    assert again.status_code == 201 and again.get_json()["subscriptions"] == 0
    assert again.get_json()["name"] == "New" and again.get_json()["created_at"]
    assert count(Consumer) == 2  # the old row stays, with the events addressed to it


# -- subscriptions of a consumer ----------------------------------------------------------------------
def test_a_subscription_belongs_to_a_consumer_and_says_so_everywhere(producer, receiver):
    put(producer, "cus_1")
    sub = producer.subscribe(receiver.url + "/a", consumer="cus_1")
    assert sub["consumer"] == "cus_1"
    assert producer.get(f"/api/v1/subscriptions/{sub['id']}").get_json()["consumer"] == "cus_1"
    listed = producer.get("/api/v1/subscriptions").get_json()["data"]
    assert [s["consumer"] for s in listed] == ["cus_1"]
    patched = producer.client.patch(f"/api/v1/subscriptions/{sub['id']}", json={"description": "mine"},
                                    headers=producer.headers())
    assert patched.status_code == 200 and patched.get_json()["consumer"] == "cus_1"
    own = producer.subscribe(receiver.url + "/b")
    assert own["consumer"] is None
    created = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "subscription.created",
                                                         AuditEntry.subscription_id == sub["id"]))
    assert created.detail["consumer"] == "cus_1"


def test_an_unknown_consumer_on_a_subscription_is_named_and_nothing_is_stored(producer, receiver):
    resp = producer.post("/api/v1/subscriptions", {"url": receiver.url + "/a", "consumer": "cus_404"})
    assert resp.status_code == 422 and "cus_404" in resp.get_json()["error"]
    assert count(Subscription) == 0
    bad = producer.post("/api/v1/subscriptions", {"url": receiver.url + "/a", "consumer": "cus 404"})
    assert bad.status_code == 400 and "consumer must be a consumer uid" in bad.get_json()["error"]


def test_patch_cannot_move_a_subscription_to_a_consumer(producer, receiver):
    put(producer, "cus_1")
    sub = producer.subscribe(receiver.url + "/a")
    resp = producer.client.patch(f"/api/v1/subscriptions/{sub['id']}", json={"consumer": "cus_1"},
                                 headers=producer.headers())
    assert resp.status_code == 400 and "unknown field(s): consumer" in resp.get_json()["error"]
    assert producer.get(f"/api/v1/subscriptions/{sub['id']}").get_json()["consumer"] is None


# -- quotas -------------------------------------------------------------------------------------------
def test_the_consumers_quota_is_per_team(client, producer):
    quotas.set_override(producer.team, "consumers", 2, actor=ADMIN)
    put(producer, "a")
    put(producer, "b")
    resp = put(producer, "c")
    assert resp.status_code == 409, resp.get_json()
    assert resp.get_json()["quota"] == "consumers" and resp.get_json()["limit"] == 2
    assert "consumers quota" in resp.get_json()["error"]
    assert put(producer, "a", {"name": "still editable"}).status_code == 200  # an update takes no room
    delete(producer, "b")
    assert put(producer, "c").status_code == 201  # a deleted one frees its room
    assert Producer(client, team_name="other").put_consumer("d")["uid"] == "d"  # another team's room is its own


def test_the_subscriptions_per_consumer_quota(producer, receiver):
    quotas.set_override(producer.team, "subscriptions_per_consumer", 2, actor=ADMIN)
    put(producer, "cus_1")
    put(producer, "cus_2")
    for path in ("/a", "/b"):
        producer.subscribe(receiver.url + path, consumer="cus_1")
    resp = producer.post("/api/v1/subscriptions", {"url": receiver.url + "/c", "consumer": "cus_1"})
    assert resp.status_code == 409 and resp.get_json()["quota"] == "subscriptions_per_consumer"
    assert "cus_1" in resp.get_json()["error"]
    assert producer.subscribe(receiver.url + "/c", consumer="cus_2")["consumer"] == "cus_2"
    assert producer.subscribe(receiver.url + "/team")["consumer"] is None  # the team's own are counted apart


def test_a_team_at_its_subscriptions_quota_still_gives_its_consumers_endpoints(producer, receiver):
    quotas.set_override(producer.team, "subscriptions", 1, actor=ADMIN)
    producer.subscribe(receiver.url + "/team")
    full = producer.post("/api/v1/subscriptions", {"url": receiver.url + "/team2"})
    assert full.status_code == 409 and full.get_json()["quota"] == "subscriptions"
    for uid in ("cus_1", "cus_2"):
        put(producer, uid)
        producer.subscribe(receiver.url + "/" + uid, consumer=uid)
    used = producer.get("/api/v1/team").get_json()["quotas"]
    assert used["subscriptions"]["used"] == 1 and used["consumers"]["used"] == 2
