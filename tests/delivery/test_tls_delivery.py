"""Mutual TLS when sending (issue 39), against an HTTPS receiver on 127.0.0.1 that requires a client certificate
from a test CA: the right certificate is delivered to; none, another authority's, or another subscription's is
refused, as a clear failed attempt; two subscriptions to one host each present their own, on connections that
are pooled but never shared; the test event and the receiver check present it too."""

from __future__ import annotations

import asyncio
import os
import ssl
import tempfile

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.delivery import failures, http, tls
from dashboard.delivery.engine import DeliveryEngine
from dashboard.models import Attempt, Delivery
from dashboard.queue.work import WorkQueue
from tests.support.client_tls import CertificateAuthority, MtlsReceiver
from tests.support.pipeline import deliver_due, run_worker

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@pytest.fixture(scope="module")
def pki():
    """One authority the receiver trusts, another it does not; keys made once for the module (EC: fast)."""
    ca, stranger = CertificateAuthority(), CertificateAuthority("Stranger CA")
    return {"ca": ca, "server": ca.issue("127.0.0.1", server=True), "alpha": ca.issue("alpha"),
            "beta": ca.issue("beta"), "stranger": stranger.issue("alpha")}


@pytest.fixture
def gateway(tmp_path, pki):
    with MtlsReceiver(tmp_path, pki["ca"], pki["server"]) as receiver:
        yield receiver


def states(subscription_id: str) -> list[str]:
    db.session.expire_all()
    return sorted(db.session.scalars(select(Delivery.state).where(Delivery.subscription_id == subscription_id)))


def attempts(subscription_id: str) -> list[Attempt]:
    return db.session.scalars(select(Attempt).join(Delivery, Delivery.id == Attempt.delivery_id)
                              .where(Delivery.subscription_id == subscription_id)).all()


def test_each_subscription_presents_its_own_certificate_on_pooled_connections(app, producer, clock, pki, gateway):
    ca = pki["ca"]
    alpha = producer.subscribe(gateway.url + "/as/alpha", tls=pki["alpha"].tls(ca))
    beta = producer.subscribe(gateway.url + "/as/beta", tls=pki["beta"].tls(ca))
    # One engine keeps its connections between drains, as a worker does: the second round finds both pooled.
    engine = DeliveryEngine(app, WorkQueue.for_app(app), clock, keep_alive=True)
    try:
        for _ in range(2):
            producer.publish()
            assert engine.drain(None, 20).attempted == 2
    finally:
        engine.close()
    assert states(alpha["id"]) == states(beta["id"]) == ["succeeded"] * 2
    assert sorted(gateway.subjects) == [("/as/alpha", "alpha")] * 2 + [("/as/beta", "beta")] * 2
    assert gateway.connections == 2  # one each, kept alive and used again, never by the other subscription


@sqlite_only
def test_none_another_authoritys_or_another_subscriptions_certificate_is_refused(app, producer, clock, pki, gateway):
    ca = pki["ca"]
    strangers = producer.subscribe(gateway.url + "/ok", tls=pki["stranger"].tls(ca))
    borrowed = producer.subscribe(gateway.url + "/as/alpha", tls=pki["beta"].tls(ca))
    producer.publish()
    deliver_due(app, clock, rounds=1)
    assert gateway.subjects == [("/as/alpha", "beta")]  # the stranger's handshake never got as far as a request
    [refused] = attempts(strangers["id"])
    # The receiver's alert, or (TLS 1.3: it judges the certificate once the client's handshake is done) the
    # connection it closed as the request was written.
    assert refused.status_code is None and refused.error.startswith("TLS error: the receiver "), refused.error
    assert "client certificate" in refused.error
    assert failures.cause(None, refused.error) == "tls_client_certificate"
    [forbidden] = attempts(borrowed["id"])
    assert forbidden.status_code == 403
    assert states(strangers["id"]) == states(borrowed["id"]) == ["scheduled"]


def send(url: str, ssl_context: ssl.SSLContext) -> http.AttemptResult:
    async def sending():
        session = http.client_session(1, True)
        try:
            return await http.post(session, url, b"{}", {}, connect_timeout=5, attempt_timeout=5, excerpt_bytes=100,
                                   allow_private=True, ssl_context=ssl_context)
        finally:
            await session.close()

    return asyncio.run(sending())


def test_a_handshake_without_a_certificate_is_a_failed_attempt_that_says_so(pki, gateway):
    # The receiver's CA trusted, no client certificate: the receiver's alert is this attempt's error, never a crash.
    result = send(gateway.url + "/ok", ssl.create_default_context(cadata=pki["ca"].pem))
    assert result.outcome.status_code is None
    assert result.outcome.error.startswith("TLS error: the receiver ") and "client certificate" in result.outcome.error
    assert gateway.subjects == []


@sqlite_only
def test_the_test_event_and_the_receiver_check_present_the_certificate(app, producer, clock, pki, gateway):
    sub = producer.subscribe(gateway.url + "/as/alpha", tls=pki["alpha"].tls(pki["ca"]))
    assert producer.post(f"/api/v1/subscriptions/{sub['id']}/test").status_code == 202
    deliver_due(app, clock)
    assert states(sub["id"]) == ["succeeded"]
    started = producer.post(f"/api/v1/subscriptions/{sub['id']}/checks")
    assert started.status_code == 202, started.get_json()
    run_worker(app)
    report = producer.get(f"/api/v1/checks/{started.get_json()['id']}").get_json()
    assert report["state"] == "finished" and report["error"] is None, report
    assert {r["rule"]: r["passed"] for r in report["results"]}["signed_accepted"] is True
    assert len(gateway.subjects) == 6 and set(gateway.subjects) == {("/as/alpha", "alpha")}  # test event, 5 checks


@sqlite_only
def test_a_plain_http_endpoint_ignores_the_setting(app, producer, clock, pki, receiver):
    sub = producer.subscribe(receiver.url + "/ok", tls=pki["alpha"].tls(pki["ca"]))
    producer.publish()
    deliver_due(app, clock)
    assert states(sub["id"]) == ["succeeded"] and receiver.count() == 1


def test_without_memory_files_the_key_passes_through_a_private_file_removed_at_once(pki, gateway, monkeypatch,
                                                                                   tmp_path):
    monkeypatch.delattr(os, "memfd_create")
    temporary = tmp_path / "temporary"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    made = tls.context(pki["alpha"].tls(pki["ca"]))
    assert list(temporary.iterdir()) == []
    assert send(gateway.url + "/as/alpha", made).outcome.status_code == 200
    assert gateway.subjects == [("/as/alpha", "alpha")]
