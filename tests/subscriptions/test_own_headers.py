"""A receiver's own headers (issue 39): an endpoint behind a gateway that demands X-Api-Key gets it on every
delivery, test event and receiver check, from real servers on 127.0.0.1; the check's credentials_required rule
sees whether the receiver refuses a request without it; the value is a credential, kept encrypted and shown
nowhere again (pages, API answers, log lines, audit entries, /metrics)."""

from __future__ import annotations

import json
import logging
import re
import uuid

import pytest
from promesa_receiver.check import CREDENTIALS_RULE, RULES
from sqlalchemy import select, text

from dashboard.core import crypto
from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Delivery, Subscription
from tests.operations.test_replays import run_worker
from tests.support import shown
from tests.support.pipeline import deliver_due
from tests.support.receiver import GatedReceiver, Receiver

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def a_key() -> str:
    return f"key-{uuid.uuid4().hex}"


def run_check(app, producer, subscription_id: str) -> dict:
    started = producer.post(f"/api/v1/subscriptions/{subscription_id}/checks")
    assert started.status_code == 202, started.get_json()
    run_worker(app)
    report = producer.get(f"/api/v1/checks/{started.get_json()['id']}").get_json()
    assert report["state"] == "finished" and report["error"] is None, report
    return report


def by_rule(report: dict) -> dict[str, dict]:
    return {r["rule"]: r for r in report["results"]}


def stored_headers(subscription_id: str) -> dict[str, str]:
    db.session.expire_all()
    ciphertext = db.session.get(Subscription, subscription_id).headers_ciphertext
    return json.loads(crypto.decrypt(ciphertext)) if ciphertext else {}


def test_an_endpoint_behind_a_key_gets_every_delivery_the_test_event_and_the_check(app, producer, clock):
    key = a_key()
    with GatedReceiver("X-Api-Key", key) as gated:
        sub = producer.subscribe(gated.url + "/ok", headers={"X-Api-Key": key, "X-Tenant": "acme-eu"})
        assert sub["headers"] == {"X-Api-Key": "••••", "X-Tenant": "••••"}
        for _ in range(3):
            producer.publish()
        sent = producer.post(f"/api/v1/subscriptions/{sub['id']}/test")
        assert sent.status_code == 202, sent.get_json()
        deliver_due(app, clock)
        states = db.session.scalars(select(Delivery.state).where(Delivery.subscription_id == sub["id"])).all()
        assert sorted(states) == ["succeeded"] * 4  # three events and the test event, none refused by the gateway
        assert all(r.headers["X-Api-Key"] == key and r.headers["X-Tenant"] == "acme-eu" for r in gated.requests)
        assert {r.headers["X-Event-Type"] for r in gated.requests} == {"file.updated", "promesa.test"}

        before = gated.count()
        report = run_check(app, producer, sub["id"])
        rules = by_rule(report)
        checked = gated.requests[before:]
        assert len(checked) == 6  # the five requests of every check, and one without the endpoint's own headers
        assert [r.headers.get("X-Api-Key") for r in checked] == [key] * 5 + [None]
        assert "X-Tenant" not in checked[-1].headers and checked[-1].headers.get("X-Signature")  # signed all the same
        assert rules["signed_accepted"]["passed"] is True
        assert rules[CREDENTIALS_RULE]["passed"] is True and rules[CREDENTIALS_RULE]["status"] == 401
        assert [r["rule"] for r in report["results"]] == [*RULES[:6], CREDENTIALS_RULE, *RULES[6:]]


@sqlite_only
def test_credentials_required_fails_against_a_receiver_that_accepts_anything(app, producer, clock):
    with Receiver() as careless:
        sub = producer.subscribe(careless.url + "/ok", headers={"X-Api-Key": a_key()})
        rule = by_rule(run_check(app, producer, sub["id"]))[CREDENTIALS_RULE]
        assert rule["passed"] is False and rule["status"] == 200
        assert "accepted a request without the headers" in rule["advice"] and "401 or 403" in rule["advice"]
        assert careless.count() == 6

        plain = producer.subscribe(careless.url + "/status/200")  # no headers of its own: the rule is not judged
        clock.advance(seconds=61)  # a team's checks start at most once a minute
        report = run_check(app, producer, plain["id"])
        assert [r["rule"] for r in report["results"]] == list(RULES)
        assert careless.count() == 11  # five more: nothing sent without headers it never had


@sqlite_only
@pytest.mark.parametrize("name", ["Host", "content-length", "Content-Type", "Transfer-Encoding", "Connection",
                                  "X-Signature", "User-Agent", "webhook-id", "Webhook-Signature", "webhook-anything",
                                  "X-Promesa-Consumer", "x-promesa-check", "X-Promesa-Other",
                                  # what every delivery carries, as dashboard.delivery.http.delivery_headers sets it
                                  "X-Event-Id", "x-event-type", "X-Delivery-Id", "X-Delivery-Attempt",
                                  "Accept-Encoding", "traceparent", "TraceParent"])
def test_headers_promesa_or_http_own_are_refused_by_name(producer, receiver, name):
    value = a_key()
    resp = producer.post("/api/v1/subscriptions", {"url": receiver.url + "/ok",
                                                   "headers": {"X-Api-Key": "fine", name: value}})
    assert resp.status_code == 422, resp.get_json()
    error = resp.get_json()["error"]
    assert name in error and value not in error
    sub = producer.subscribe(receiver.url + "/ok")
    resp = producer.client.patch(f"/api/v1/subscriptions/{sub['id']}", json={"headers": {name: value}},
                                 headers=producer.headers())
    assert resp.status_code == 422 and name in resp.get_json()["error"]


@sqlite_only
@pytest.mark.parametrize("headers, status, words", [
    ({f"X-H{i}": "v" for i in range(11)}, 400, "at most 10 headers"),
    ({"X-A": "a" * 2100, "X-B": "b" * 2100}, 422, "at most 4096 bytes"),
    ({"X-Api-Key": "line\r\nX-Injected: 1"}, 400, "without CR, LF or NUL"),
    ({"X-Api-Key": "line\nnext"}, 400, "without CR, LF or NUL"),
    ({"X-Api-Key": "nul\u0000"}, 400, "without CR, LF or NUL"),
    ({"X-Api-Key": "caf\u00e9"}, 400, "printable ASCII"),
    ({"X-Api-Key": ""}, 400, "printable ASCII"),
    ({"X Api Key": "v"}, 400, "RFC 9110 tokens"),
    ({"X-Api-Key": "one", "x-api-key": "two"}, 422, "the same header"),
])
def test_malformed_headers_are_refused_saying_what_is_wrong(producer, receiver, headers, status, words):
    resp = producer.post("/api/v1/subscriptions", {"url": receiver.url + "/ok", "headers": headers})
    assert resp.status_code == status, resp.get_json()
    assert words in resp.get_json()["error"]
    assert db.session.scalar(select(Subscription)) is None


@sqlite_only
def test_values_are_encrypted_at_rest(producer, receiver):
    key = a_key()
    sub = producer.subscribe(receiver.url + "/ok", headers={"X-Api-Key": key})
    raw = db.session.execute(text("SELECT * FROM subscriptions WHERE id = :id"), {"id": sub["id"]}).one()
    assert key not in repr(tuple(raw)) and "X-Api-Key" not in repr(tuple(raw))
    assert stored_headers(sub["id"]) == {"X-Api-Key": key}


@sqlite_only
def test_an_edit_merges_a_null_removes_and_a_name_left_out_keeps_its_value(producer, receiver):
    key, tenant = a_key(), a_key()
    sub = producer.subscribe(receiver.url + "/ok", headers={"X-Api-Key": key, "X-Tenant": tenant})

    def patch(body):
        resp = producer.client.patch(f"/api/v1/subscriptions/{sub['id']}", json=body, headers=producer.headers())
        return resp.status_code, resp.get_json()

    assert patch({"description": "no headers given"})[0] == 200
    assert stored_headers(sub["id"]) == {"X-Api-Key": key, "X-Tenant": tenant}
    new_key = a_key()
    status, body = patch({"headers": {"X-Api-Key": new_key, "X-Region": "eu"}})
    assert status == 200 and body["headers"] == {"X-Api-Key": "••••", "X-Tenant": "••••", "X-Region": "••••"}
    assert stored_headers(sub["id"]) == {"X-Api-Key": new_key, "X-Tenant": tenant, "X-Region": "eu"}
    assert patch({"headers": {"x-tenant": None}})[1]["headers"] == {"X-Api-Key": "••••", "X-Region": "••••"}
    status, body = patch({"headers": {"X-Api-Key": "••••"}})  # the masked value a read shows is not a value
    assert status == 400 and "masked value" in body["error"]
    status, body = patch({"headers": {f"X-More-{i}": "v" for i in range(9)}})  # 11 once merged
    assert status == 422 and "at most 10 headers" in body["error"]
    assert stored_headers(sub["id"]) == {"X-Api-Key": new_key, "X-Region": "eu"}
    assert patch({"headers": None})[1]["headers"] == {}
    assert db.session.get(Subscription, sub["id"]).headers_ciphertext is None
    [*_, edited] = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "subscription.edited")
                                      .order_by(AuditEntry.id)).all()
    assert edited.detail == {"before": {"headers": {"X-Api-Key": "••••", "X-Region": "••••"}},
                             "after": {"headers": {}}}


FORM = {"description": "", "event_types": ["*"], "retry_policy": "exponential", "connect_timeout": "5",
        "attempt_timeout": "10", "max_age_seconds": "86400", "rate_limit_per_s": "", "max_in_flight": ""}


@sqlite_only
def test_the_forms_set_keep_replace_and_remove_headers(client, auth, producer, receiver, users):
    key, tenant = a_key(), a_key()
    auth.login("owner")
    page = client.get("/subscriptions/new").get_data(as_text=True)
    assert page.count('name="header_name"') == 2 and 'type="password"' in page
    resp = client.post("/subscriptions/new", data={
        **FORM, "csrf_token": auth.csrf(), "team": "acme", "url": receiver.url + "/ok", "signature_scheme": "promesa",
        "header_name": ["X-Api-Key", "X-Tenant"], "header_value": [key + "\r\n", tenant]})  # a pasted line's end
    assert resp.status_code == 303, resp.get_data(as_text=True)
    sub = db.session.scalar(select(Subscription))
    assert stored_headers(sub.id) == {"X-Api-Key": key, "X-Tenant": tenant}

    edit = client.get(f"/subscriptions/{sub.id}/edit").get_data(as_text=True)
    assert 'value="X-Api-Key"' in edit and 'placeholder="unchanged"' in edit and key not in edit
    assert edit.count('name="header_name"') == 4  # the two saved, and two more to fill in
    new_key = a_key()
    form = {**FORM, "csrf_token": auth.csrf(), "url": sub.url}
    # X-Api-Key replaced, X-Tenant's row cleared (removed), X-Region added.
    resp = client.post(f"/subscriptions/{sub.id}/edit", data={
        **form, "header_name": ["X-Api-Key", "", "X-Region"], "header_value": [new_key, "", "eu"]})
    assert resp.status_code == 302, resp.get_data(as_text=True)
    assert stored_headers(sub.id) == {"X-Api-Key": new_key, "X-Region": "eu"}
    flashed = client.get(f"/subscriptions/{sub.id}").get_data(as_text=True)
    assert "headers X-Api-Key: •••• (new value), X-Region: •••• (new value) (was X-Api-Key: ••••, X-Tenant: ••••)" \
        in flashed
    # Value boxes left empty keep the values.
    resp = client.post(f"/subscriptions/{sub.id}/edit", data={
        **form, "header_name": ["X-Api-Key", "X-Region"], "header_value": ["", ""]})
    assert resp.status_code == 302 and stored_headers(sub.id) == {"X-Api-Key": new_key, "X-Region": "eu"}
    refused = client.post(f"/subscriptions/{sub.id}/edit", data={
        **form, "header_name": ["X-Api-Key", "X-Region", "X-New"], "header_value": ["", "", ""]})
    assert refused.status_code == 400 and "give the header X-New a value" in refused.get_data(as_text=True)
    refused = client.post(f"/subscriptions/{sub.id}/edit", data={
        **form, "header_name": ["X-Api-Key", "Host"], "header_value": ["", "evil.example"]})
    assert refused.status_code == 422 and "Host may not be set" in refused.get_data(as_text=True)
    assert stored_headers(sub.id) == {"X-Api-Key": new_key, "X-Region": "eu"}


def test_no_value_appears_in_any_page_api_answer_log_line_audit_entry_or_metrics(app, client, auth, producer, clock,
                                                                                  users, caplog):
    caplog.set_level(logging.DEBUG)
    key, replaced = a_key(), a_key()
    with GatedReceiver("X-Api-Key", replaced) as gated:
        created = producer.post("/api/v1/subscriptions", {"url": gated.url + "/ok", "headers": {"X-Api-Key": key}})
        answers = [created.get_data(as_text=True)]
        sub_id = created.get_json()["id"]
        auth.login("owner")
        edited = client.post(f"/subscriptions/{sub_id}/edit", data={
            **FORM, "csrf_token": auth.csrf(), "url": gated.url + "/ok",
            "header_name": ["X-Api-Key"], "header_value": [replaced]})
        assert edited.status_code == 302
        answers.append(producer.client.patch(f"/api/v1/subscriptions/{sub_id}", json={"headers": {"X-Other": key}},
                                             headers=producer.headers()).get_data(as_text=True))
        producer.publish()
        answers.append(producer.post(f"/api/v1/subscriptions/{sub_id}/test").get_data(as_text=True))
        deliver_due(app, clock)
        report = run_check(app, producer, sub_id)
        assert by_rule(report)[CREDENTIALS_RULE]["passed"] is True
        assert all(r.headers["X-Api-Key"] == replaced for r in gated.requests[:-1])  # sent, where it should be

        delivery_id = db.session.scalar(select(Delivery.id).where(Delivery.state == "succeeded"))
        answers += shown.api_reads(producer, sub_id, report["id"])
        answers.append(producer.get("/api/v1/openapi.json").get_data(as_text=True))
        html = shown.pages(client, sub_id, delivery_id)
        assert "X-Api-Key: ••••" in html[f"/subscriptions/{sub_id}"]
        assert "X-Api-Key" in html[f"/deliveries/{delivery_id}"] and "••••" in html[f"/deliveries/{delivery_id}"]
        assert "X-Api-Key" in html[f"/subscriptions/{sub_id}/contract"]
        assert "credentials_required" in html[f"/subscriptions/{sub_id}"]  # the check's card shows the rule
        audit = shown.audit_entries()
        assert any("X-Api-Key" in entry for entry in audit)  # the names are there, the values are not
        shown.assert_nowhere({"first value": key, "replaced value": replaced}, API=answers,
                             pages=list(html.values()), audit=audit,
                             metrics=[client.get("/metrics").get_data(as_text=True)], logs=[shown.logged(caplog)])


@sqlite_only
def test_a_consumer_sets_its_endpoints_headers_in_the_portal_and_deliveries_carry_them(app, producer, clock):
    from tests.support.portal import open_portal

    producer.put_consumer("cus_1", name="Initech")
    portal = app.test_client()
    open_portal(portal, producer, "cus_1")

    def csrf():
        return re.search(r'name="csrf_token" value="([^"]+)"', portal.get("/portal/").get_data(as_text=True)).group(1)

    key = a_key()
    with GatedReceiver("Authorization", f"Bearer {key}") as gated:
        form = {k: v for k, v in FORM.items() if k != "max_in_flight"}
        assert 'name="header_name"' in portal.get("/portal/endpoints/new").get_data(as_text=True)
        resp = portal.post("/portal/endpoints/new", data={
            **form, "csrf_token": csrf(), "url": gated.url + "/ok", "signature_scheme": "promesa",
            "header_name": ["Authorization", ""], "header_value": [f"Bearer {key}", ""]})
        assert resp.status_code == 303, resp.get_data(as_text=True)
        sub = db.session.scalar(select(Subscription))
        page = portal.get(f"/portal/subscriptions/{sub.id}").get_data(as_text=True)
        assert "Authorization: ••••" in page and key not in page
        edit = portal.get(f"/portal/subscriptions/{sub.id}/edit").get_data(as_text=True)
        assert 'value="Authorization"' in edit and key not in edit
        assert producer.post("/api/v1/events", {"type": "file.updated", "consumer": "cus_1"}).status_code == 202
        deliver_due(app, clock)
        [got] = gated.requests
        assert got.headers["Authorization"] == f"Bearer {key}" and got.headers["X-Promesa-Consumer"] == "cus_1"
        assert db.session.scalar(select(Delivery.state)) == "succeeded"
