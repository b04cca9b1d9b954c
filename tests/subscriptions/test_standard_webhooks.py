"""Subscriptions on the Standard Webhooks scheme, checked by the reference `standardwebhooks` package."""

from __future__ import annotations

import json

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from promesa_receiver import signing
from dashboard.core.clock import utcnow

from tests.support.pipeline import deliver_due


def test_the_reference_vector():
    # The known vector from the Standard Webhooks reference libraries.
    assert signing.standard_signature("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek",
                                      1614265330, b'{"test": 2432232314}') \
        == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_promesa_deliveries_verify_with_the_reference_library(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/ok", signature_scheme="standard-webhooks")
    event_id = producer.publish("file.updated", {"resource_id": "f_1"})["id"]
    clock.set(utcnow())  # the reference library checks the timestamp against the real clock
    deliver_due(app, clock)
    [got] = receiver.requests
    headers = {k.lower(): v for k, v in got.headers.items()}
    assert headers["webhook-id"] == event_id  # stable across retries: the receiver's idempotency key
    assert "x-signature" not in headers
    payload = Webhook(sub["secret"]).verify(got.body, headers)
    assert payload["id"] == event_id and payload["data"] == {"resource_id": "f_1"}
    with pytest.raises(WebhookVerificationError):
        Webhook(sub["secret"]).verify(got.body.replace(b"f_1", b"f_2"), headers)
    assert json.loads(got.body)["type"] == "file.updated"
