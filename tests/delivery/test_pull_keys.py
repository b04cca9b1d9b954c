"""A pull subscription's own key (issue 40): it pulls and acks that subscription and nothing else, is shown once,
and a replaced key pulls nothing. On SQLite and PostgreSQL."""

from __future__ import annotations

from promesa_receiver import verify
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry

from tests.delivery.test_pull import pull_subscription


def with_key(client, key, method, path, body=None):
    return client.open(path, method=method, json=body, headers={"Authorization": f"Bearer {key}"})


def test_the_key_pulls_and_acks_its_subscription_and_reads_nothing_else(client, producer):
    sub = pull_subscription(producer, event_types=["file.*"])
    other = pull_subscription(producer, event_types=["file.*"])
    key = sub["pull_key"]
    assert key.startswith("pull_") and sub["pull_key_prefix"] == key[:10] and other["pull_key"] != key
    shown = producer.get(f"/api/v1/subscriptions/{sub['id']}").get_json()
    assert shown["pull_key_prefix"] == key[:10] and "pull_key" not in shown and key not in str(shown)
    producer.post("/api/v1/events", {"type": "file.updated", "data": {"resource_id": "f_1", "resource_version": 1}})

    resp = with_key(client, key, "GET", f"/api/v1/subscriptions/{sub['id']}/pull")
    [item] = resp.get_json()["data"]
    verify(item["body"].encode(), item["headers"]["X-Signature"], [sub["secret"]])
    resp = with_key(client, key, "POST", f"/api/v1/subscriptions/{sub['id']}/pull/ack",
                    [{"delivery_id": item["delivery_id"], "attempt": 1, "status": 200}])
    assert resp.get_json()["data"][0]["state"] == "succeeded"

    for method, path in [("GET", f"/api/v1/subscriptions/{other['id']}/pull"),
                         ("GET", "/api/v1/subscriptions"), ("GET", f"/api/v1/subscriptions/{sub['id']}"),
                         ("POST", "/api/v1/events"), ("POST", f"/api/v1/subscriptions/{sub['id']}/pull-key")]:
        resp = with_key(client, key, method, path, {"type": "file.updated", "data": {}} if method == "POST" else None)
        assert resp.status_code == 401, (method, path, resp.get_json())


def test_a_replaced_key_pulls_nothing_and_the_new_one_is_shown_once(client, producer):
    sub = pull_subscription(producer, event_types=["file.*"])
    resp = producer.post(f"/api/v1/subscriptions/{sub['id']}/pull-key")
    assert resp.status_code == 200
    new = resp.get_json()["pull_key"]
    assert new != sub["pull_key"] and resp.get_json()["pull_key_prefix"] == new[:10]
    assert with_key(client, sub["pull_key"], "GET", f"/api/v1/subscriptions/{sub['id']}/pull").status_code == 401
    assert with_key(client, new, "GET", f"/api/v1/subscriptions/{sub['id']}/pull").status_code == 200
    entry = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "subscription.pull_key_replaced"))
    assert entry.detail == {"previous": sub["pull_key"][:10], "new": new[:10]} and new not in str(entry.detail)

    assert producer.client.delete(f"/api/v1/subscriptions/{sub['id']}", headers=producer.headers()).status_code < 300
    assert with_key(client, new, "GET", f"/api/v1/subscriptions/{sub['id']}/pull").status_code == 401


def test_a_push_subscription_has_no_key(producer, receiver):
    resp = producer.post("/api/v1/subscriptions", {"url": receiver.url})
    assert resp.get_json()["pull_key"] is None and resp.get_json()["pull_key_prefix"] is None
    resp = producer.post(f"/api/v1/subscriptions/{resp.get_json()['id']}/pull-key")
    assert resp.status_code == 409 and "push subscription" in resp.get_json()["error"]
