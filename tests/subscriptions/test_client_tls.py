"""A client certificate on a subscription (issue 39, mutual TLS): checked on input (the key is the certificate's,
the certificate in date by the app's clock, an encrypted key or unreadable PEM refused, each with a 422 that says
what is wrong), kept encrypted, shown by subject, issuer and expiry only (API, pages, forms, contract, audit log),
and watched: 14 days before it ends the subscription page warns and the incident rule certificate_expiring opens,
until the certificate is replaced."""

from __future__ import annotations

import json
import logging
import re

import pytest
from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Incident, Subscription
from dashboard.operations import incidents
from dashboard.subscriptions import client_tls
from tests.support.client_tls import CertificateAuthority, key_pem
from tests.support.pipeline import deliver_due

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

FORM = {"description": "", "event_types": ["*"], "retry_policy": "exponential", "connect_timeout": "5",
        "attempt_timeout": "10", "max_age_seconds": "86400", "rate_limit_per_s": "", "max_in_flight": ""}


@pytest.fixture(scope="module")
def pki():
    ca = CertificateAuthority()
    return {"ca": ca, "alpha": ca.issue("alpha"), "beta": ca.issue("beta"), "soon": ca.issue("soon", days=(-1, 20)),
            "expired": ca.issue("expired", days=(-30, -2)), "early": ca.issue("early", days=(3, 30))}


def key_body(issued) -> str:
    """A line of the key's PEM: what must appear nowhere once given."""
    return issued.key.splitlines()[1]


def patch(producer, sub_id: str, body: dict):
    resp = producer.client.patch(f"/api/v1/subscriptions/{sub_id}", json=body, headers=producer.headers())
    return resp.status_code, resp.get_json()


def subscription_count() -> int:
    return db.session.scalar(select(func.count()).select_from(Subscription))


@sqlite_only
def test_reads_show_subject_issuer_and_expiry_and_never_the_key(producer, receiver, pki):
    alpha, ca = pki["alpha"], pki["ca"]
    created = producer.subscribe(receiver.url + "/ok", tls=alpha.tls(ca))
    shown = {"subject": "O=Tests,CN=alpha", "issuer": "CN=Promesa Test CA",
             "expires_at": alpha.not_after.isoformat(timespec="milliseconds") + "Z", "ca_certificates": True}
    assert created["tls"] == shown
    sub = db.session.get(Subscription, created["id"])
    assert (sub.tls_subject, sub.tls_issuer, sub.tls_expires_at) == ("O=Tests,CN=alpha", "CN=Promesa Test CA",
                                                                      alpha.not_after)
    assert key_body(alpha) not in sub.tls_ciphertext and client_tls.stored(sub)["client_key"] == alpha.key

    status, edited = patch(producer, created["id"], {"tls": pki["beta"].tls()})  # no CA bundle this time
    assert status == 200 and edited["tls"]["subject"] == "O=Tests,CN=beta" and edited["tls"]["ca_certificates"] is False
    assert patch(producer, created["id"], {"tls": pki["beta"].tls()})[1]["tls"] == edited["tls"]  # the same: no change
    status, removed = patch(producer, created["id"], {"tls": None})
    assert status == 200 and removed["tls"] is None
    db.session.expire_all()
    assert db.session.get(Subscription, created["id"]).tls_ciphertext is None

    answers = [producer.get(path).get_data(as_text=True) for path in (
        f"/api/v1/subscriptions/{created['id']}", "/api/v1/subscriptions", "/api/v1/openapi.json")]
    assert '"tls"' in answers[2] and "client_certificate" in answers[2]  # the document has the field
    audit = db.session.scalars(select(AuditEntry).where(AuditEntry.subscription_id == created["id"])
                               .order_by(AuditEntry.id)).all()
    assert [e.action for e in audit] == ["subscription.created", "subscription.edited", "subscription.edited"]
    assert audit[0].detail["tls"] == shown
    assert audit[1].detail["before"]["tls"] == shown and audit[1].detail["after"]["tls"]["subject"] == "O=Tests,CN=beta"
    assert audit[2].detail["after"]["tls"] is None
    texts = [json.dumps(e.detail) for e in audit] + answers
    for issued in (alpha, pki["beta"]):
        assert not any(key_body(issued) in text or "PRIVATE KEY" in text for text in texts)


@sqlite_only
@pytest.mark.parametrize("which, words", [
    ("expired", "the certificate has expired (valid from "),
    ("early", "the certificate is not valid yet (valid from "),
])
def test_a_certificate_out_of_date_is_refused_with_its_dates(producer, receiver, pki, which, words):
    issued = pki[which]
    resp = producer.post("/api/v1/subscriptions", {"url": receiver.url + "/ok", "tls": issued.tls()})
    assert resp.status_code == 422, resp.get_json()
    error = resp.get_json()["error"]
    assert error.startswith("tls.client_certificate: " + words), error
    assert issued.not_after.isoformat(timespec="milliseconds") + "Z" in error and "now is " in error
    assert subscription_count() == 0  # nothing stored half-way
    sub = producer.subscribe(receiver.url + "/ok")
    status, body = patch(producer, sub["id"], {"tls": issued.tls()})
    assert status == 422 and body["error"].startswith("tls.client_certificate: " + words)


@sqlite_only
def test_a_key_that_is_not_the_certificates_or_unreadable_pem_is_refused_saying_what(producer, receiver, pki):
    alpha, beta = pki["alpha"], pki["beta"]
    refusals = [
        ({**alpha.tls(), "client_key": beta.key}, 422, "tls.client_key: the key is not the certificate's"),
        ({**alpha.tls(), "client_key": key_pem(alpha.key_object, b"passphrase")}, 422,
         "tls.client_key: the key is encrypted with a passphrase"),
        ({**alpha.tls(), "client_key": "-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n"}, 422,
         "tls.client_key: no PEM private key could be read"),
        ({**alpha.tls(), "client_certificate": "not a certificate"}, 422,
         "tls.client_certificate: no PEM certificate could be read"),
        ({**alpha.tls(), "ca_certificates": "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"}, 422,
         "tls.ca_certificates: no PEM certificate could be read"),
        ({**alpha.tls(), "client_certificate": alpha.certificate * 120}, 400, "at most 65536 characters"),
        ({"client_certificate": alpha.certificate}, 400, "client_key"),
    ]
    for tls, status, words in refusals:
        resp = producer.post("/api/v1/subscriptions", {"url": receiver.url + "/ok", "tls": tls})
        assert resp.status_code == status and words in resp.get_json()["error"], (words, resp.get_json())
        assert key_body(alpha) not in resp.get_data(as_text=True)
    assert subscription_count() == 0
    # A certificate followed by its chain (the CA's, here) is one certificate with its chain.
    chained = producer.subscribe(receiver.url + "/ok", tls={**alpha.tls(), "client_certificate":
                                                            alpha.certificate + pki["ca"].pem})
    assert chained["tls"]["subject"] == "O=Tests,CN=alpha"


def test_fourteen_days_ahead_the_page_warns_and_an_incident_opens_until_it_is_replaced(
        app, client, auth, users, producer, receiver, clock, pki):
    soon = pki["soon"]  # ends in 20 days
    sub = producer.subscribe(receiver.url + "/ok", tls=soon.tls())
    auth.login("owner")

    def incident():
        db.session.expire_all()
        return db.session.scalar(select(Incident).where(Incident.subscription_id == sub["id"]))

    incidents.check_rules(clock.now())
    page = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    assert incident() is None and 'id="certificate-expiring"' not in page
    assert "O=Tests,CN=soon" in page and "CN=Promesa Test CA" in page  # subject and issuer, with its expiry

    clock.advance(days=5, hours=23)  # 14 days and a bit before it ends: nothing yet
    incidents.check_rules(clock.now())
    assert incident() is None
    clock.advance(hours=2)  # now within 14 days
    incidents.check_rules(clock.now())
    opened = incident()
    assert (opened.rule, opened.state) == ("certificate_expiring", "open")
    assert opened.figures["subject"] == "O=Tests,CN=soon" and opened.figures["days_left"] == 13
    auth.login("owner")  # the session signed in days ago (by the clock) has ended
    page = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    assert 'id="certificate-expiring"' in page and "in 13 days" in page
    assert "client certificate expiring" in client.get("/").get_data(as_text=True)  # the overview's row says so
    shown = client.get(f"/incidents/{opened.id}").get_data(as_text=True)
    assert "Client certificate expiring" in shown and "expires within 14 days" in shown
    assert "the client certificate O=Tests,CN=soon expires at" in shown

    status, _ = patch(producer, sub["id"], {"tls": pki["alpha"].tls()})  # replaced by one good for a year
    assert status == 200
    incidents.check_rules(clock.now())
    assert incident().state == "resolved"
    assert 'id="certificate-expiring"' not in client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)


@sqlite_only
def test_the_forms_set_keep_and_remove_a_certificate_and_never_show_the_key(client, auth, users, producer, receiver,
                                                                           pki):
    alpha, ca = pki["alpha"], pki["ca"]
    auth.login("owner")
    page = client.get("/subscriptions/new").get_data(as_text=True)
    assert 'name="tls_certificate"' in page and 'name="tls_key"' in page and 'name="tls_ca"' in page
    refused = client.post("/subscriptions/new", data={
        **FORM, "csrf_token": auth.csrf(), "team": "acme", "url": receiver.url + "/ok", "signature_scheme": "promesa",
        "tls_certificate": pki["expired"].certificate, "tls_key": pki["expired"].key})
    assert refused.status_code == 422 and "the certificate has expired" in refused.get_data(as_text=True)
    assert key_body(pki["expired"]) not in refused.get_data(as_text=True)  # the key box is never filled back in
    resp = client.post("/subscriptions/new", data={
        **FORM, "csrf_token": auth.csrf(), "team": "acme", "url": receiver.url + "/ok", "signature_scheme": "promesa",
        "tls_certificate": alpha.certificate, "tls_key": alpha.key, "tls_ca": ca.pem})
    assert resp.status_code == 303, resp.get_data(as_text=True)
    sub = db.session.scalar(select(Subscription))
    assert sub.tls_subject == "O=Tests,CN=alpha"

    edit = client.get(f"/subscriptions/{sub.id}/edit").get_data(as_text=True)
    assert "O=Tests,CN=alpha" in edit and 'placeholder="unchanged"' in edit and key_body(alpha) not in edit
    form = {**FORM, "csrf_token": auth.csrf(), "url": sub.url}
    resp = client.post(f"/subscriptions/{sub.id}/edit", data={**form, "description": "kept"})  # boxes left empty
    assert resp.status_code == 302
    db.session.expire_all()
    assert client_tls.stored(db.session.get(Subscription, sub.id)) == {
        "client_certificate": alpha.certificate, "client_key": alpha.key, "ca_certificates": ca.pem}
    refused = client.post(f"/subscriptions/{sub.id}/edit", data={**form, "tls_certificate": pki["beta"].certificate})
    assert refused.status_code == 422 and "the key is not the certificate" in refused.get_data(as_text=True)
    resp = client.post(f"/subscriptions/{sub.id}/edit", data={**form, "tls_remove": "on"})
    assert resp.status_code == 302
    flashed = client.get(f"/subscriptions/{sub.id}").get_data(as_text=True)
    assert "client certificate none (was O=Tests,CN=alpha, expires" in flashed and key_body(alpha) not in flashed
    db.session.expire_all()
    assert db.session.get(Subscription, sub.id).tls_ciphertext is None


@sqlite_only
def test_the_contract_names_the_subject_the_receiver_should_expect(client, auth, users, producer, receiver, pki):
    sub = producer.subscribe(receiver.url + "/ok", tls=pki["alpha"].tls())
    terms = producer.get(f"/api/v1/subscriptions/{sub['id']}/contract").get_json()["client_certificate"]
    assert terms["subject"] == "O=Tests,CN=alpha" and terms["issuer"] == "CN=Promesa Test CA"
    assert terms["expires_at"] == sub["tls"]["expires_at"]
    auth.login("owner")
    page = client.get(f"/subscriptions/{sub['id']}/contract").get_data(as_text=True)
    assert "presents a client certificate with subject O=Tests,CN=alpha" in page
    assert key_body(pki["alpha"]) not in page
    plain = producer.subscribe(receiver.url + "/ok")
    assert producer.get(f"/api/v1/subscriptions/{plain['id']}/contract").get_json()["client_certificate"][
        "subject"] is None


@sqlite_only
def test_the_key_appears_in_no_page_api_answer_log_line_audit_entry_or_metrics(app, client, auth, users, producer,
                                                                               receiver, clock, pki, caplog):
    caplog.set_level(logging.DEBUG)
    alpha = pki["alpha"]
    sub_id = producer.subscribe(receiver.url + "/ok", tls=alpha.tls(pki["ca"]))["id"]
    producer.publish()
    deliver_due(app, clock)  # plain http: the setting is carried, and no handshake made
    assert receiver.count() == 1
    auth.login("owner")
    api = [producer.get(path) for path in (
        f"/api/v1/subscriptions/{sub_id}", "/api/v1/subscriptions", f"/api/v1/subscriptions/{sub_id}/deliveries",
        f"/api/v1/subscriptions/{sub_id}/contract", f"/api/v1/subscriptions/{sub_id}/diagnosis")]
    pages = [client.get(path) for path in (f"/subscriptions/{sub_id}", f"/subscriptions/{sub_id}/edit",
                                           f"/subscriptions/{sub_id}/contract", "/audit", "/", "/metrics")]
    assert all(resp.status_code == 200 for resp in api + pages), [resp.status_code for resp in api + pages]
    texts = [resp.get_data(as_text=True) for resp in api + pages]
    assert "O=Tests,CN=alpha" in texts[len(api)]  # the subscription page names the certificate
    texts += [json.dumps(e.detail) for e in db.session.scalars(select(AuditEntry))]
    texts.append(caplog.text + " ".join(r.getMessage() for r in caplog.records))
    assert not [text[:80] for text in texts if key_body(alpha) in text or "PRIVATE KEY" in text]


@sqlite_only
def test_a_consumer_gives_its_endpoint_a_certificate_in_the_portal(app, producer, receiver, pki):
    from tests.support.portal import open_portal

    producer.put_consumer("cus_1", name="Initech")
    portal = app.test_client()
    open_portal(portal, producer, "cus_1")
    page = portal.get("/portal/endpoints/new").get_data(as_text=True)
    assert 'name="tls_certificate"' in page and 'name="tls_key"' in page
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    form = {k: v for k, v in FORM.items() if k != "max_in_flight"}
    resp = portal.post("/portal/endpoints/new", data={
        **form, "csrf_token": csrf, "url": receiver.url + "/ok", "signature_scheme": "promesa",
        "tls_certificate": pki["alpha"].certificate, "tls_key": pki["alpha"].key})
    assert resp.status_code == 303, resp.get_data(as_text=True)
    sub = db.session.scalar(select(Subscription))
    shown = portal.get(f"/portal/subscriptions/{sub.id}").get_data(as_text=True)
    assert "O=Tests,CN=alpha" in shown and key_body(pki["alpha"]) not in shown
