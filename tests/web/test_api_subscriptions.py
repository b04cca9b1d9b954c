"""POST /api/v1/subscriptions and the subscription routes."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from dashboard.core import crypto
from dashboard.core.extensions import db
from dashboard.models import Subscription


def subscription_count():
    return db.session.scalar(select(func.count()).select_from(Subscription))


def test_it_creates_a_subscription_and_shows_the_secret_once(producer, receiver):
    resp = producer.post("/api/v1/subscriptions", {"url": receiver.url + "/ok", "event_types": ["file.*"],
                                                   "retry_policy": "quick-then-sweep", "description": "files"})
    assert resp.status_code == 201
    body = resp.get_json()
    assert body["id"].startswith("sub_") and body["secret"].startswith("whsec_")
    assert body["event_types"] == ["file.*"] and body["retry_policy"] == "quick-then-sweep"
    assert body["state"] == "active"
    stored = db.session.get(Subscription, body["id"])
    assert body["secret"] not in stored.secret_ciphertext  # encrypted at rest
    assert crypto.decrypt(stored.secret_ciphertext) == body["secret"]
    again = producer.get(f"/api/v1/subscriptions/{body['id']}").get_json()
    assert "secret" not in again
    listed = producer.get("/api/v1/subscriptions").get_json()["data"]
    assert [s["id"] for s in listed] == [body["id"]] and "secret" not in listed[0]


@pytest.mark.parametrize("payload, status, words", [
    ({}, 422, "url: a push subscription needs the URL"),  # optional in the document: pull subscriptions have none
    ({"url": "ftp://example.com/x"}, 400, "url must be an http:// or https:// URL"),
    ({"url": "not a url"}, 400, "url must be an http:// or https:// URL"),
    ({"url": "https://user:pw@example.com/"}, 422, "credentials"),
    ({"url": 5}, 400, "url must be an http:// or https:// URL"),
    ({"url": "https://example.com/", "event_types": "file.*"}, 400, "event_types must be a non-empty list"),
    ({"url": "https://example.com/", "event_types": []}, 400, "event_types must be a non-empty list"),
    ({"url": "https://example.com/", "retry_policy": "forever"}, 400, "retry_policy must be one of"),
    ({"url": "https://example.com/", "signature_scheme": "md5"}, 400, "signature_scheme must be one of"),
    ({"url": "https://example.com/", "attempt_timeout": 60}, 400, "attempt_timeout must be a number from"),
    ({"url": "https://example.com/", "connect_timeout": "fast"}, 400, "connect_timeout must be a number"),
    ({"url": "https://example.com/", "secret": "mine"}, 400, "unknown field(s): secret"),
    ({"url": "https://example.com/", "description": "x" * 501}, 400, "description must be a string"),
])
def test_it_rejects_bad_subscriptions_and_stores_nothing(producer, payload, status, words):
    resp = producer.post("/api/v1/subscriptions", payload)
    assert resp.status_code == status, resp.get_json()
    assert words in resp.get_json()["error"]
    assert subscription_count() == 0


def test_private_targets_are_refused_unless_allowed(app, producer):
    app.config["PROMESA_ALLOW_PRIVATE_TARGETS"] = False
    for url in ("http://127.0.0.1:9/", "http://10.1.2.3/hook", "http://localhost/x", "http://[::1]/"):
        resp = producer.post("/api/v1/subscriptions", {"url": url})
        assert resp.status_code == 422 and "private" in resp.get_json()["error"], url
    assert subscription_count() == 0


def test_another_team_cannot_touch_a_subscription(producer, client, receiver):
    from tests.conftest import Producer

    sub = producer.subscribe(receiver.url + "/ok")
    other = Producer(client, team_name="other")
    pulled = producer.post("/api/v1/subscriptions", {"mode": "pull"}).get_json()
    for path in ("", "/deliveries"):
        assert other.get(f"/api/v1/subscriptions/{sub['id']}{path}").status_code == 404
    assert other.get(f"/api/v1/subscriptions/{pulled['id']}/pull").status_code == 404
    assert other.post(f"/api/v1/subscriptions/{pulled['id']}/pull/ack",
                      [{"delivery_id": "dlv_1", "attempt": 1, "status": 200}]).status_code == 404
    for action in ("pause", "resume", "replay"):
        assert other.post(f"/api/v1/subscriptions/{sub['id']}/{action}").status_code == 404
    assert db.session.get(Subscription, sub["id"]).state == "active"


def test_it_lists_deliveries_by_state_with_pages(producer, receiver):
    sub = producer.subscribe(receiver.url + "/ok")
    ids = [producer.publish()["id"] for _ in range(3)]
    page = producer.get(f"/api/v1/subscriptions/{sub['id']}/deliveries?state=pending&limit=2").get_json()
    assert len(page["data"]) == 2 and page["next_before"]
    rest = producer.get(f"/api/v1/subscriptions/{sub['id']}/deliveries?state=pending&limit=2"
                        f"&before={page['next_before']}").get_json()
    assert len(rest["data"]) == 1 and rest["next_before"] is None
    assert sorted(d["event_id"] for d in page["data"] + rest["data"]) == sorted(ids)
    assert producer.get(f"/api/v1/subscriptions/{sub['id']}/deliveries?state=dead").get_json()["data"] == []
    bad = producer.get(f"/api/v1/subscriptions/{sub['id']}/deliveries?state=lost")
    assert bad.status_code == 400 and "state must be one of" in bad.get_json()["error"]
    bad = producer.get(f"/api/v1/subscriptions/{sub['id']}/deliveries?limit=1000")
    assert bad.status_code == 400 and "limit" in bad.get_json()["error"]


def test_the_openapi_document_describes_every_route(app, client):
    doc = client.get("/api/v1/openapi.json").get_json()
    assert doc["openapi"].startswith("3.")
    documented = {("/api/v1" + path, method.upper()) for path, ops in doc["paths"].items() for method in ops}
    served = set()
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith("/api/v1"):
            path = rule.rule.replace("<", "{").replace(">", "}")
            served |= {(path, m) for m in rule.methods - {"HEAD", "OPTIONS"}}
    assert served == documented
