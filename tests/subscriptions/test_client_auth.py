"""A receiver's OAuth2 client credentials on its subscription (issue 39): given on create and edit (API and the
dashboard's and portal's forms), checked with words that say what is wrong, the secret encrypted and never shown
again (API answers, pages, the audit log, logs); the receiver check sends the token, judges credentials_required
with one request without it, and says auth failed (judging nothing) when the token cannot be had. Real token
server and receivers on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import re

import pytest
from promesa_receiver.check import CREDENTIALS_RULE, RULES
from sqlalchemy import select, text

from dashboard.core import crypto
from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Delivery, Subscription
from tests.operations.test_replays import run_worker
from tests.subscriptions.test_own_headers import FORM, by_rule, run_check
from tests.support import shown
from tests.support.pipeline import deliver_due
from tests.support.token_server import BearerReceiver, TokenServer

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
MASKED = "••••"


def stored_auth(subscription_id: str) -> dict | None:
    db.session.expire_all()
    ciphertext = db.session.get(Subscription, subscription_id).auth_ciphertext
    return json.loads(crypto.decrypt(ciphertext)) if ciphertext else None


def patch(producer, subscription_id: str, body: dict):
    resp = producer.client.patch(f"/api/v1/subscriptions/{subscription_id}", json=body, headers=producer.headers())
    return resp.status_code, resp.get_json()


def test_the_check_sends_the_token_and_judges_credentials_required_with_a_request_without_it(app, producer):
    with TokenServer() as tokens, BearerReceiver(tokens) as receiver:
        sub = producer.subscribe(receiver.url + "/ok", auth=tokens.auth(), headers={"X-Tenant": "acme"})
        report = run_check(app, producer, sub["id"])
        rules = by_rule(report)
        assert [r["rule"] for r in report["results"]] == [*RULES[:6], CREDENTIALS_RULE, *RULES[6:]]
        assert rules["signed_accepted"]["passed"] is True
        assert rules[CREDENTIALS_RULE]["passed"] is True and rules[CREDENTIALS_RULE]["status"] == 401
        assert "without the bearer token" in rules[CREDENTIALS_RULE]["detail"]
        [token] = tokens.issued
        sent = [r.headers.get("Authorization") for r in receiver.requests]
        assert sent == [f"Bearer {token}"] * 5 + [None]
        assert "X-Tenant" not in receiver.requests[-1].headers and receiver.requests[-1].headers["X-Signature"]


@sqlite_only
def test_credentials_required_fails_where_the_receiver_takes_requests_without_a_token(app, producer, receiver):
    with TokenServer() as tokens:
        sub = producer.subscribe(receiver.url + "/ok", auth=tokens.auth())
        rule = by_rule(run_check(app, producer, sub["id"]))[CREDENTIALS_RULE]
        assert rule["passed"] is False and rule["status"] == 200
        assert "accepted a request without the bearer token" in rule["advice"]


@sqlite_only
def test_a_check_without_a_token_says_auth_failed_and_judges_no_signature_rule(app, client, auth, producer, users):
    with TokenServer() as tokens, BearerReceiver(tokens) as receiver:
        tokens.status = 500
        sub = producer.subscribe(receiver.url + "/ok", auth=tokens.auth())
        started = producer.post(f"/api/v1/subscriptions/{sub['id']}/checks")
        run_worker(app)
        report = producer.get(f"/api/v1/checks/{started.get_json()['id']}").get_json()
        assert report["state"] == "finished" and report["error"].startswith("auth failed: the token endpoint answered 500")
        assert receiver.count() == 0
        judged = {r["rule"]: r["passed"] for r in report["results"]}
        assert set(judged) == {*RULES, CREDENTIALS_RULE} and set(judged.values()) == {None}
        assert all("no OAuth2 token" in r["detail"] for r in report["results"] if r["rule"] != "https")
        auth.login("owner")
        page = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
        assert "The check could not judge the endpoint: auth failed" in page


@sqlite_only
@pytest.mark.parametrize("auth, status, words", [
    ({"token_url": "ftp://auth.example.com/token"}, 400, "auth: token_url must be an http:// or https:// URL"),
    ({"token_url": "http://user:pw@auth.example.com/token"}, 422, "auth.token_url: must not carry credentials"),
    ({"client_id": "line\nbreak"}, 400, "auth: client_id must be 1 to 256 characters, printable ASCII"),
    ({"client_id": ""}, 400, "auth: client_id must be 1 to 256 characters"),
    ({"client_secret": "x" * 1025}, 400, "auth: client_secret must be 1 to 1024 characters"),
    ({"client_secret": None}, 400, "auth: client_secret must be"),
    ({"scope": "caf\u00e9"}, 400, "auth: scope must be at most 1024 characters, printable ASCII"),
    ({"type": "oauth2_password"}, 400, "auth: type must be oauth2_client_credentials"),
    ({"grant_type": "client_credentials"}, 400, "unknown field(s): grant_type"),
])
def test_malformed_credentials_are_refused_saying_what_is_wrong(producer, receiver, auth, status, words):
    given = {"type": "oauth2_client_credentials", "token_url": receiver.url + "/token", "client_id": "promesa",
             "client_secret": "cs-kept-out"} | auth
    resp = producer.post("/api/v1/subscriptions", {"url": receiver.url + "/ok", "auth": given})
    assert resp.status_code == status, resp.get_json()
    assert words in resp.get_json()["error"] and "cs-kept-out" not in resp.get_json()["error"]
    assert db.session.scalar(select(Subscription)) is None


@sqlite_only
def test_a_private_token_url_is_refused_as_a_private_endpoint_url_is(app, producer):
    app.config["PROMESA_ALLOW_PRIVATE_TARGETS"] = False
    resp = producer.post("/api/v1/subscriptions", {"url": "https://93.184.215.14/hooks", "auth": {
        "type": "oauth2_client_credentials", "token_url": "http://127.0.0.1:9/token", "client_id": "c",
        "client_secret": "s"}})
    assert resp.status_code == 422 and resp.get_json()["error"].startswith("auth.token_url: host '127.0.0.1' is a private")


@sqlite_only
def test_an_edit_keeps_the_secret_unless_given_and_null_removes_the_credentials(producer, receiver):
    with TokenServer() as tokens:
        sub = producer.subscribe(receiver.url + "/ok", auth=tokens.auth(scope="a"))
        assert sub["auth"] == {"type": "oauth2_client_credentials", "token_url": tokens.url, "client_id": "promesa",
                               "client_secret": MASKED, "scope": "a", "audience": None}
        kept = tokens.auth(scope="b")
        del kept["client_secret"]
        status, body = patch(producer, sub["id"], {"auth": kept})
        assert status == 200 and body["auth"]["scope"] == "b"
        assert stored_auth(sub["id"])["client_secret"] == tokens.client_secret
        status, body = patch(producer, sub["id"], {"auth": kept | {"client_id": "another"}})
        assert status == 422 and "auth.client_secret is required" in body["error"] and "client id changed" in body["error"]
        status, body = patch(producer, sub["id"], {"auth": tokens.auth(client_secret="cs-new")})
        assert status == 200 and stored_auth(sub["id"])["client_secret"] == "cs-new"
        status, body = patch(producer, sub["id"], {"headers": {"authorization": "Bearer mine"}})
        assert status == 422 and "authorization carries the OAuth2 bearer token" in body["error"]
        status, body = patch(producer, sub["id"], {"auth": None})
        assert status == 200 and body["auth"] is None and stored_auth(sub["id"]) is None
        status, body = patch(producer, sub["id"], {"auth": kept})
        assert status == 422 and "no client credentials yet" in body["error"]
        edits = db.session.scalars(select(AuditEntry.detail).where(AuditEntry.action == "subscription.edited")
                                   .order_by(AuditEntry.id)).all()
        assert [e["after"]["auth"] and e["after"]["auth"]["client_secret"] for e in edits] == [
            MASKED, f"{MASKED} (new value)", None]


@sqlite_only
def test_the_forms_set_keep_and_remove_the_credentials(client, auth, producer, receiver, users):
    with TokenServer() as tokens:
        auth.login("owner")
        page = client.get("/subscriptions/new").get_data(as_text=True)
        assert 'name="auth_token_url"' in page and 'name="auth_client_secret" type="password"' in page
        resp = client.post("/subscriptions/new", data={
            **FORM, "csrf_token": auth.csrf(), "team": "acme", "url": receiver.url + "/ok", "signature_scheme": "promesa",
            "auth_token_url": tokens.url, "auth_client_id": "promesa", "auth_client_secret": tokens.client_secret,
            "auth_scope": "", "auth_audience": "hooks"})
        assert resp.status_code == 303, resp.get_data(as_text=True)
        sub = db.session.scalar(select(Subscription))
        assert stored_auth(sub.id) == {"type": "oauth2_client_credentials", "token_url": tokens.url,
                                       "client_id": "promesa", "client_secret": tokens.client_secret, "scope": None,
                                       "audience": "hooks"}
        shown = client.get(f"/subscriptions/{sub.id}").get_data(as_text=True)
        assert "OAuth2 client credentials" in shown and tokens.url in shown and tokens.client_secret not in shown

        edit = client.get(f"/subscriptions/{sub.id}/edit").get_data(as_text=True)
        assert f'value="{tokens.url}"' in edit and "leave empty to keep" in edit and tokens.client_secret not in edit
        form = {**FORM, "csrf_token": auth.csrf(), "url": sub.url, "auth_token_url": tokens.url,
                "auth_client_id": "promesa", "auth_client_secret": "", "auth_scope": "webhooks", "auth_audience": "hooks"}
        resp = client.post(f"/subscriptions/{sub.id}/edit", data=form)
        assert resp.status_code == 302 and stored_auth(sub.id)["client_secret"] == tokens.client_secret
        assert stored_auth(sub.id)["scope"] == "webhooks"
        refused = client.post(f"/subscriptions/{sub.id}/edit", data=form | {"auth_client_id": "other"})
        assert refused.status_code == 422 and "auth.client_secret is required" in refused.get_data(as_text=True)
        cleared = {name: "" for name in form if name.startswith("auth_")}
        resp = client.post(f"/subscriptions/{sub.id}/edit", data=form | cleared)
        assert resp.status_code == 302 and stored_auth(sub.id) is None


@sqlite_only
def test_a_consumer_sets_credentials_in_the_portal_and_deliveries_carry_the_token(app, producer, clock):
    from tests.support.portal import open_portal

    producer.put_consumer("cus_1", name="Initech")
    portal = app.test_client()
    open_portal(portal, producer, "cus_1")
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', portal.get("/portal/").get_data(as_text=True)).group(1)
    with TokenServer() as tokens, BearerReceiver(tokens) as receiver:
        form = {k: v for k, v in FORM.items() if k != "max_in_flight"}
        resp = portal.post("/portal/endpoints/new", data={
            **form, "csrf_token": csrf, "url": receiver.url + "/ok", "signature_scheme": "promesa",
            "auth_token_url": tokens.url, "auth_client_id": "promesa", "auth_client_secret": tokens.client_secret})
        assert resp.status_code == 303, resp.get_data(as_text=True)
        sub = db.session.scalar(select(Subscription))
        assert "leave empty to keep" in portal.get(f"/portal/subscriptions/{sub.id}/edit").get_data(as_text=True)
        assert producer.post("/api/v1/events", {"type": "file.updated", "consumer": "cus_1"}).status_code == 202
        deliver_due(app, clock)
        assert receiver.requests[0].headers["Authorization"] == f"Bearer {tokens.issued[0]}"
        assert db.session.scalar(select(Delivery.state)) == "succeeded"


def test_no_secret_nor_token_appears_in_any_page_api_answer_log_line_audit_entry_or_metrics(
        app, client, auth, producer, clock, users, caplog):
    caplog.set_level(logging.DEBUG)
    with TokenServer() as tokens, BearerReceiver(tokens) as receiver:
        answers = []
        created = producer.post("/api/v1/subscriptions", {"url": receiver.url + "/ok",
                                                          "auth": tokens.auth(client_secret="cs-first-one")})
        answers.append(created.get_data(as_text=True))
        sub_id = created.get_json()["id"]
        answers.append(json.dumps(patch(producer, sub_id, {"auth": tokens.auth()})[1]))
        producer.publish()
        answers.append(producer.post(f"/api/v1/subscriptions/{sub_id}/test").get_data(as_text=True))
        deliver_due(app, clock)
        report = run_check(app, producer, sub_id)
        assert by_rule(report)[CREDENTIALS_RULE]["passed"] is True
        delivery_id = db.session.scalar(select(Delivery.id).where(Delivery.state == "succeeded"))
        answers += shown.api_reads(producer, sub_id, report["id"])
        openapi = producer.get("/api/v1/openapi.json").get_json()
        assert "auth" in openapi["components"]["schemas"]["SubscriptionInput"]["properties"]
        auth.login("owner")
        html = shown.pages(client, sub_id, delivery_id)
        assert f"<code>Authorization</code></th><td><code>Bearer {MASKED}</code>" in html[f"/deliveries/{delivery_id}"]
        assert tokens.url in html[f"/subscriptions/{sub_id}/contract"] and "Bearer" in html[f"/subscriptions/{sub_id}/contract"]
        audit = shown.audit_entries()
        assert any(tokens.url in entry for entry in audit)
        raw = db.session.execute(text("SELECT * FROM subscriptions")).one()
        assert tokens.issued
        shown.assert_nowhere({"first secret": "cs-first-one", "secret": tokens.client_secret,
                              **{f"token {n}": token for n, token in enumerate(tokens.issued)}},
                             API=answers, pages=list(html.values()), audit=audit,
                             metrics=[client.get("/metrics").get_data(as_text=True)], logs=[shown.logged(caplog)],
                             database=[repr(tuple(raw))])
