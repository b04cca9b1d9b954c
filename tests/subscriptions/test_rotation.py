"""Secret rotation with a grace period, checked by the receivers' own libraries: Stripe's, the
`standardwebhooks` package, and the published TypeScript snippet under Node."""

from __future__ import annotations

import base64
import datetime as dt
import json
import subprocess

import pytest
import standardwebhooks
import stripe
from sqlalchemy import select

from dashboard.core import crypto
from dashboard.subscriptions import snippets
from dashboard.core.clock import unix, utcnow
from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Subscription
from dashboard.operations.sweeper import sweep_once

from tests.support.pipeline import deliver_due
from tests.subscriptions.test_contract import ROOT, node_or_skip

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
GRACE = 60


@pytest.fixture
def recent_clock(clock):
    """The libraries check timestamps against the real time: start two minutes back, so that a delivery
    during the grace and one after it (60 s later) both fall inside their 300 s window."""
    clock.set(utcnow() - dt.timedelta(seconds=120))
    return clock


def rotate(producer, sub_id, **body):
    resp = producer.post(f"/api/v1/subscriptions/{sub_id}/rotate-secret", body or None)
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()


def delivered(app, producer, receiver, clock):
    before = receiver.count()
    producer.publish("file.updated", {"resource_id": "f_1", "resource_version": 3})
    deliver_due(app, clock)
    assert receiver.count() == before + 1
    return receiver.requests[-1]


def stripe_accepts(got, secret) -> bool:
    try:
        return stripe.WebhookSignature.verify_header(got.body, got.headers["X-Signature"], secret, tolerance=300)
    except stripe.SignatureVerificationError:
        return False


def standard_accepts(got, secret) -> bool:
    headers = {k: v for k, v in got.headers.items() if k.lower().startswith("webhook-")}
    try:
        standardwebhooks.Webhook(secret).verify(got.body, headers)
        return True
    except standardwebhooks.WebhookVerificationError:
        return False


def test_stripe_verifies_old_and_new_during_the_grace_and_only_new_after(app, producer, receiver, recent_clock):
    sub = producer.subscribe(receiver.url + "/ok")
    old = sub["secret"]
    rotated = rotate(producer, sub["id"], grace_seconds=GRACE)
    new = rotated["secret"]
    assert new != old and new.startswith("whsec_")
    assert [s["which"] for s in rotated["signing_secrets"]] == ["current", "previous"]

    during = delivered(app, producer, receiver, recent_clock)
    t, v1_new, v1_old = during.headers["X-Signature"].split(",")  # t=…,v1=<new>,v1=<old>
    assert t.startswith("t=") and v1_new.startswith("v1=") and v1_old.startswith("v1=")
    assert stripe_accepts(during, new) and stripe_accepts(during, old)

    recent_clock.advance(seconds=GRACE)  # the grace ends: signing ignores the old secret before any sweep
    after = delivered(app, producer, receiver, recent_clock)
    assert after.headers["X-Signature"].count("v1=") == 1
    assert stripe_accepts(after, new) and not stripe_accepts(after, old)


@sqlite_only
def test_standard_webhooks_verifies_old_and_new_during_the_grace_and_only_new_after(app, producer, receiver,
                                                                                    recent_clock):
    sub = producer.subscribe(receiver.url + "/ok", signature_scheme="standard-webhooks")
    old = sub["secret"]
    new = rotate(producer, sub["id"], grace_seconds=GRACE)["secret"]

    during = delivered(app, producer, receiver, recent_clock)
    first, second = during.headers["webhook-signature"].split(" ")  # v1,<new> v1,<old>
    assert first.startswith("v1,") and second.startswith("v1,")
    assert standard_accepts(during, new) and standard_accepts(during, old)

    recent_clock.advance(seconds=GRACE)
    after = delivered(app, producer, receiver, recent_clock)
    assert " " not in after.headers["webhook-signature"]
    assert standard_accepts(after, new) and not standard_accepts(after, old)


@sqlite_only
@pytest.mark.parametrize("scheme, function", [("promesa", "verifyPromesaSignature"),
                                              ("standard-webhooks", "verifyStandardWebhook")])
def test_the_typescript_snippet_accepts_both_secrets_during_the_grace(app, producer, receiver, clock, scheme,
                                                                     function):
    node = node_or_skip()
    sub = producer.subscribe(receiver.url + "/ok", signature_scheme=scheme)
    old = sub["secret"]
    new = rotate(producer, sub["id"])["secret"]  # the default grace: 24 h
    got = delivered(app, producer, receiver, clock)
    signature = got.headers["X-Signature"] if scheme == "promesa" else \
        {k: v for k, v in got.headers.items() if k.lower().startswith("webhook-")}
    stranger = "whsec_" + base64.b64encode(b"s" * 24).decode()
    cases = [(new, True), (old, True), (stranger, False)]
    payload = [{"body_b64": base64.b64encode(got.body).decode(), "signature": signature, "secret": secret,
                "now": unix(clock.now())} for secret, _ in cases]
    snippet = snippets.HERE / snippets.FILES[(scheme, "typescript")]
    run = subprocess.run([node, str(ROOT / "tests/support/run_snippet.mjs"), str(snippet), function],
                         input=json.dumps(payload), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [expected for _, expected in cases]


@sqlite_only
def test_a_second_rotation_keeps_two_secrets_signing_the_newest_and_the_previous(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/ok")
    first = sub["secret"]
    second = rotate(producer, sub["id"])["secret"]
    third = rotate(producer, sub["id"], grace_seconds=3600)["secret"]
    got = delivered(app, producer, receiver, clock)
    header = got.headers["X-Signature"]
    assert header.count("v1=") == 2
    timestamp = int(header.split(",")[0][2:])

    def sign(secret):
        import hmac
        return hmac.new(secret.encode(), f"{timestamp}.".encode() + got.body, "sha256").hexdigest()

    assert header.split(",")[1:] == [f"v1={sign(third)}", f"v1={sign(second)}"]
    assert f"v1={sign(first)}" not in header
    stored = db.session.get(Subscription, sub["id"])
    assert second not in stored.previous_secret_ciphertext  # encrypted at rest
    assert crypto.decrypt(stored.previous_secret_ciphertext) == second


@sqlite_only
def test_no_grace_and_end_grace_leave_only_the_newest_secret(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/ok")
    body = rotate(producer, sub["id"], grace_seconds=0)
    assert [s["which"] for s in body["signing_secrets"]] == ["current"]
    assert delivered(app, producer, receiver, clock).headers["X-Signature"].count("v1=") == 1

    rotate(producer, sub["id"])
    assert delivered(app, producer, receiver, clock).headers["X-Signature"].count("v1=") == 2
    ended = producer.post(f"/api/v1/subscriptions/{sub['id']}/end-grace")
    assert ended.status_code == 200 and [s["which"] for s in ended.get_json()["signing_secrets"]] == ["current"]
    assert db.session.get(Subscription, sub["id"]).previous_secret_ciphertext is None  # deleted, not just unused
    assert delivered(app, producer, receiver, clock).headers["X-Signature"].count("v1=") == 1


def test_the_sweeper_deletes_a_previous_secret_when_its_grace_ends(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/ok")
    rotate(producer, sub["id"], grace_seconds=3600)
    clock.advance(seconds=3599)
    sweep_once(app)
    assert db.session.get(Subscription, sub["id"]).previous_secret_ciphertext is not None
    clock.advance(seconds=1)
    sweep_once(app)
    db.session.expire_all()
    stored = db.session.get(Subscription, sub["id"])
    assert stored.previous_secret_ciphertext is None and stored.previous_secret_expires_at is None
    ended = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "subscription.grace_ended")).all()
    assert [(e.subscription_id, e.actor_kind, e.detail) for e in ended] == [(sub["id"], "system", {"by": "expiry"})]


@sqlite_only
@pytest.mark.parametrize("body, words", [
    ({"grace_seconds": -1}, "grace_seconds must be a whole number from 0 to 604800"),
    ({"grace_seconds": 7 * 86400 + 1}, "grace_seconds must be a whole number from 0 to 604800"),
    ({"grace_seconds": "1h"}, "grace_seconds must be a whole number"),
    ({"grace_seconds": 1.5}, "grace_seconds must be a whole number"),
    ({"secret": "mine"}, "unknown field(s): secret"),
])
def test_it_refuses_a_bad_grace_and_changes_nothing(producer, receiver, body, words):
    sub = producer.subscribe(receiver.url + "/ok")
    resp = producer.post(f"/api/v1/subscriptions/{sub['id']}/rotate-secret", body)
    assert resp.status_code == 400 and words in resp.get_json()["error"]
    assert crypto.decrypt(db.session.get(Subscription, sub["id"]).secret_ciphertext) == sub["secret"]


@sqlite_only
def test_the_new_secret_is_shown_once_and_the_audit_log_never_holds_one(producer, receiver, client):
    from tests.conftest import Producer

    sub = producer.subscribe(receiver.url + "/ok")
    new = rotate(producer, sub["id"], grace_seconds=7 * 86400)["secret"]
    again = producer.get(f"/api/v1/subscriptions/{sub['id']}").get_json()
    assert "secret" not in again and new not in json.dumps(again)
    assert [s["which"] for s in again["signing_secrets"]] == ["current", "previous"]
    [entry] = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "subscription.secret_rotated")).all()
    assert entry.detail["grace_seconds"] == 7 * 86400
    assert new not in json.dumps(entry.detail) and sub["secret"] not in json.dumps(entry.detail)
    other = Producer(client, team_name="other")
    assert other.post(f"/api/v1/subscriptions/{sub['id']}/rotate-secret").status_code == 404
