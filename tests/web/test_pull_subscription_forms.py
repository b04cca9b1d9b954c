"""Pull subscriptions from the forms (issue 40): the dashboard's new subscription form and the portal's new endpoint
form create one (push's boxes left as the browser sends them, empty), its created page shows the secret once and
where to pull, a push-only box filled in is refused in the API's words with nothing stored, and its edit form
saves event types and filter without a push's boxes; its test event waits to be pulled."""

from __future__ import annotations

import re

import pytest
from promesa_receiver import verify
from sqlalchemy import func, select

from dashboard.core import crypto
from dashboard.core.clock import unix
from dashboard.core.extensions import db
from dashboard.delivery.pull import PUSH_ONLY
from dashboard.models import AuditEntry, Subscription

from tests.support.portal import open_portal

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]

# A pull form as a browser posts it: push's boxes are on it (hidden), empty.
PUSH_BOXES_EMPTY = {"url": "", "connect_timeout": "", "attempt_timeout": "", "rate_limit_per_s": "",
                    "max_in_flight": "", "header_name": ["", ""], "header_value": ["", ""], "auth_token_url": "",
                    "auth_client_id": "", "auth_client_secret": "", "auth_scope": "", "auth_audience": "",
                    "tls_certificate": "", "tls_key": "", "tls_ca": ""}
PULL_FORM = {**PUSH_BOXES_EMPTY, "mode": "pull", "description": "warehouse loader", "event_types": "*",
             "event_patterns": "", "filter": '{"data.region": "eu"}', "event_versions": "",
             "retry_policy": "quick-then-sweep", "max_age_seconds": "3600", "signature_scheme": "promesa"}
# What a push-only box holds when filled in, and the API's field it is.
FILLED = [({"url": "https://example.com/hooks"}, "url"), ({"rate_limit_per_s": "5"}, "rate_limit_per_s"),
          ({"connect_timeout": "2"}, "connect_timeout"),
          ({"header_name": ["X-Api-Key", ""], "header_value": ["k", ""]}, "headers")]
NO_PUSH_BOX = ('name="url"', 'name="connect_timeout"', 'name="rate_limit_per_s"', 'name="header_name"',
               'name="auth_token_url"', 'name="tls_certificate"')


def count() -> int:
    return db.session.scalar(select(func.count()).select_from(Subscription))


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)


def refusal(field: str) -> str:
    return f"{field}: a pull subscription takes no {field} ({PUSH_ONLY[field]})"


def test_an_owner_creates_a_pull_subscription_and_is_shown_its_secret_once_and_where_to_pull(
        app, client, auth, producer, clock, users):
    auth.login("owner")
    form = client.get("/subscriptions/new?mode=pull").get_data(as_text=True)
    assert re.search(r'name="mode" value="pull" checked', form) and "Pull: my receiver fetches its deliveries" in form
    assert client.post("/subscriptions/new", data={**PULL_FORM, "team": "acme"}).status_code == 400  # no CSRF token
    auth.login("member")
    assert client.post("/subscriptions/new", data={**PULL_FORM, "team": "acme",
                                                   "csrf_token": auth.csrf()}).status_code == 403
    assert count() == 0

    auth.login("owner")
    push = client.post("/subscriptions/new", data={**PULL_FORM, "mode": "push", "team": "acme",
                                                   "csrf_token": auth.csrf()})  # the URL's box is not required
    assert push.status_code == 422 and "url: a push subscription needs the URL" in push.get_data(as_text=True)
    assert count() == 0
    resp = client.post("/subscriptions/new", data={**PULL_FORM, "team": "acme", "csrf_token": auth.csrf()})
    sub = db.session.scalar(select(Subscription))
    assert resp.status_code == 303 and resp.headers["Location"] == f"/subscriptions/{sub.id}/created"
    assert (sub.mode, sub.url, sub.filter, sub.retry_policy, sub.max_age_seconds, sub.rate_limit_per_s,
            sub.headers_ciphertext, sub.auth_ciphertext, sub.description) == \
        ("pull", None, {"data.region": "eu"}, "quick-then-sweep", 3600, None, None, None, "warehouse loader")
    created = client.get(resp.headers["Location"])
    html = created.get_data(as_text=True)
    secret = crypto.decrypt(sub.secret_ciphertext)
    assert created.headers["Cache-Control"] == "no-store" and re.search(r'id="new-secret">([^<]+)<', html)[1] == secret
    key = re.search(r'id="new-pull-key">([^<]+)<', html)[1]
    assert key.startswith("pull_") and sub.pull_key_prefix == key[:10]
    assert f"http://localhost:5000/api/v1/subscriptions/{sub.id}/pull?limit=10&amp;lease=30" in html
    assert f'href="/subscriptions/{sub.id}/contract#pull"' in html and "Pulling instead of receiving" in html
    assert "Run receiver check" not in html and "receives" not in html  # nothing is sent to it, nothing to check
    again = client.get(resp.headers["Location"]).get_data(as_text=True)
    assert secret not in again and key not in again  # shown once
    [entry] = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "subscription.created"))
    assert entry.actor == "owner@example.com" and entry.detail["mode"] == "pull"

    # The secret the page showed is the one its pulled deliveries are signed with.
    producer.post("/api/v1/events", {"type": "file.updated", "data": {"resource_id": "f_1", "region": "eu"}})
    [item] = client.get(f"/api/v1/subscriptions/{sub.id}/pull?limit=10&lease=30",
                        headers={"Authorization": f"Bearer {key}"}).get_json()["data"]
    assert verify(item["body"].encode(), item["headers"]["X-Signature"], [secret], now=unix(clock.now()))


@pytest.mark.parametrize(("filled", "field"), FILLED)
def test_a_push_only_box_filled_in_with_pull_is_refused_in_the_apis_words(client, auth, users, filled, field):
    auth.login("owner")
    resp = client.post("/subscriptions/new", data={**PULL_FORM, **filled, "team": "acme", "csrf_token": auth.csrf()})
    html = resp.get_data(as_text=True)
    assert resp.status_code == 422 and refusal(field) in html.replace("&#39;", "'")
    assert re.search(r'name="mode" value="pull" checked', html) and "push-given" in html  # shown, to be emptied
    assert count() == 0


def test_a_pull_subscriptions_edit_form_has_no_push_box_and_saves_its_types_and_filter(client, auth, producer,
                                                                                        users):
    sub = producer.post("/api/v1/subscriptions", {"mode": "pull", "event_types": ["file.*"]}).get_json()
    auth.login("owner")
    assert f'href="/subscriptions/{sub["id"]}/edit"' in client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    form = client.get(f"/subscriptions/{sub['id']}/edit").get_data(as_text=True)
    assert "A subscription keeps its mode" in form and "to push" in form and 'name="mode"' not in form
    assert [box for box in NO_PUSH_BOX if box in form] == []
    edited = {"csrf_token": auth.csrf(), "event_types": ["invoice.paid"], "event_patterns": "file.*",
              "filter": '{"data.amount": {"$gte": 100}}', "retry_policy": "exponential", "max_age_seconds": "86400",
              "description": "ledger"}
    resp = client.post(f"/subscriptions/{sub['id']}/edit", data=edited)
    assert resp.status_code == 302, resp.get_data(as_text=True)
    saved = db.session.get(Subscription, sub["id"])
    assert (saved.event_types, saved.filter, saved.description, saved.mode, saved.url) == \
        (["invoice.paid", "file.*"], {"data.amount": {"$gte": 100}}, "ledger", "pull", None)
    resp = client.post(f"/subscriptions/{sub['id']}/edit", data={**edited, "attempt_timeout": "3"})
    assert resp.status_code == 422 and refusal("attempt_timeout") in resp.get_data(as_text=True)
    db.session.expire_all()
    assert db.session.get(Subscription, sub["id"]).attempt_timeout == 10
    sent = client.post(f"/subscriptions/{sub['id']}/test", data={"csrf_token": auth.csrf()},
                       headers={"HX-Request": "true"}).get_data(as_text=True)
    assert "waiting for its receiver to pull and acknowledge it" in sent  # nothing is sent to it to answer


def test_a_consumer_creates_and_edits_a_pull_endpoint_in_its_portal(app, producer, users):
    producer.put_consumer("cus_1")
    portal = app.test_client()
    open_portal(portal, producer, "cus_1")
    form = portal.get("/portal/endpoints/new?mode=pull").get_data(as_text=True)
    assert re.search(r'name="mode" value="pull" checked', form) and "the endpoint's own pull key" in form
    assert portal.post("/portal/endpoints/new", data=PULL_FORM).status_code == 400  # no CSRF token
    refused = portal.post("/portal/endpoints/new", data={**PULL_FORM, "url": "https://example.com/hooks",
                                                         "csrf_token": csrf_of(form)})
    assert refused.status_code == 422 and refusal("url") in refused.get_data(as_text=True).replace("&#39;", "'")
    assert count() == 0

    resp = portal.post("/portal/endpoints/new", data={**PULL_FORM, "csrf_token": csrf_of(form)})
    sub = db.session.scalar(select(Subscription))
    assert resp.status_code == 303 and resp.headers["Location"] == f"/portal/subscriptions/{sub.id}/created"
    assert (sub.mode, sub.url, sub.consumer.uid) == ("pull", None, "cus_1")
    html = portal.get(resp.headers["Location"]).get_data(as_text=True)
    assert crypto.decrypt(sub.secret_ciphertext) in html and f"/api/v1/subscriptions/{sub.id}/pull" in html
    assert "Tokens" not in html and "docs/" not in html
    # The consumer's receiver pulls with the endpoint's own key, which the page showed once.
    key = re.search(r'id="new-pull-key">([^<]+)<', html)[1]
    pulled = app.test_client().get(f"/api/v1/subscriptions/{sub.id}/pull", headers={"Authorization": f"Bearer {key}"})
    assert pulled.status_code == 200 and key not in portal.get(resp.headers["Location"]).get_data(as_text=True)

    edit = portal.get(f"/portal/subscriptions/{sub.id}/edit").get_data(as_text=True)
    assert [box for box in NO_PUSH_BOX if box in edit] == [] and "An endpoint keeps its mode" in edit
    resp = portal.post(f"/portal/subscriptions/{sub.id}/edit", data={
        "csrf_token": csrf_of(edit), "event_types": "*", "filter": '{"data.region": "us"}',
        "retry_policy": "exponential", "max_age_seconds": "86400"})
    assert resp.status_code == 302
    db.session.expire_all()
    assert db.session.get(Subscription, sub.id).filter == {"data.region": "us"}
    assert [(e.actor_kind, e.actor) for e in db.session.scalars(
        select(AuditEntry).where(AuditEntry.action.in_(("subscription.created", "subscription.edited"))))] == \
        [("portal", "cus_1")] * 2


def test_the_pull_key_is_replaced_from_the_subscription_page_and_shown_once(app, client, auth, producer, users):
    sub = producer.post("/api/v1/subscriptions", {"mode": "pull"}).get_json()
    old = sub["pull_key"]
    auth.login("member")
    page = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    assert old[:10] in page and old not in page and "Replace pull key" not in page
    assert client.post(f"/subscriptions/{sub['id']}/replace-pull-key",
                       data={"csrf_token": auth.csrf()}).status_code == 403
    auth.login("owner")
    assert "Replace pull key" in client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    assert client.post(f"/subscriptions/{sub['id']}/replace-pull-key").status_code == 400  # no CSRF token
    resp = client.post(f"/subscriptions/{sub['id']}/replace-pull-key", data={"csrf_token": auth.csrf()})
    assert resp.status_code == 303
    shown = client.get(resp.headers["Location"])
    new = re.search(r'id="new-pull-key">([^<]+)<', shown.get_data(as_text=True))[1]
    assert shown.headers["Cache-Control"] == "no-store" and new != old
    assert new not in client.get(resp.headers["Location"]).get_data(as_text=True)  # shown once

    def pulls(key):
        return app.test_client().get(f"/api/v1/subscriptions/{sub['id']}/pull",
                                     headers={"Authorization": f"Bearer {key}"}).status_code

    assert (pulls(old), pulls(new)) == (401, 200)
    [entry] = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "subscription.pull_key_replaced"))
    assert entry.actor == "owner@example.com" and new not in str(entry.detail)
