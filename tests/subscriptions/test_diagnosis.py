"""The diagnosis: a subscription's failed attempts of the last 24 h grouped by cause, each with advice,
read from the attempts the real pipeline stored (real receivers on 127.0.0.1, real TLS, real DNS
failures); asking for it sends nothing."""

from __future__ import annotations

import re
import socket
import ssl

import aiohttp.connector
import pytest

from tests.support.pipeline import deliver_due
from tests.support.tls import TlsReceiver

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def closed_port_url() -> str:
    with socket.socket() as s:  # a port nothing listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/hook"


def diagnosis(producer, subscription_id: str) -> dict:
    resp = producer.get(f"/api/v1/subscriptions/{subscription_id}/diagnosis")
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()


# (the receiver's path, or a URL maker; the cause; words its advice must say)
CAUSES = [
    ("dns", "http://no-such-host.invalid/hook", ["does not resolve"]),
    ("refused", closed_port_url, ["Nothing accepts connections"]),
    ("timeout", "/slow/2", ["answer 2xx fast, work later", "against the 0.5 s limit"]),
    ("redirect", "/redirect", ["register the final URL"]),
    ("unauthorized", "/status/401", ["current secret", "raw body"]),
    ("unauthorized", "/status/403", ["signature check"]),
    ("not_found", "/status/404", ["path is wrong"]),
    ("gone", "/status/410", ["disabled the subscription"]),
    ("too_large", "/status/413", ["too large"]),
    ("rate_limited", "/status/429", ["set a rate limit on this subscription"]),
    ("server_error", "/status/503", ["answer 2xx before anything that can fail"]),
    ("client_error", "/status/422", ["4xx"]),
]


@sqlite_only
@pytest.mark.parametrize("cause, target, words", CAUSES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CAUSES)])
def test_each_kind_of_failure_is_its_own_cause_with_advice(app, producer, receiver, clock, cause, target, words):
    url = target() if callable(target) else target if target.startswith("http") else receiver.url + target
    # Only the slow receiver meets the short limit: a loaded machine can take 0.5 s to answer a status.
    sub = producer.subscribe(url, attempt_timeout=0.5 if cause == "timeout" else 10)
    producer.publish()
    producer.publish()
    deliver_due(app, clock)
    found = diagnosis(producer, sub["id"])
    assert [g["cause"] for g in found["groups"]] == [cause], found
    group = found["groups"][0]
    assert group["count"] == 2 and found["failures"] == 2 and found["attempts"] == 2
    for word in words:
        assert word in group["advice"], group["advice"]
    assert group["example"] and group["last_at"]


@sqlite_only
@pytest.mark.parametrize("kind, cause, advice", [
    ("self_signed", "tls_self_signed", "self-signed"),
    ("expired", "tls_expired", "expired"),
    ("wrong_name", "tls_name", "does not name the URL's host"),
])
def test_tls_failures_say_what_is_wrong_with_the_certificate(app, producer, clock, tmp_path, monkeypatch,
                                                              kind, cause, advice):
    with TlsReceiver(tmp_path, kind) as tls:
        # The test's authority is trusted (as a public one would be): only the flaw of `kind` remains.
        monkeypatch.setattr(aiohttp.connector, "_SSL_CONTEXT_VERIFIED", ssl.create_default_context(cafile=tls.ca_file))
        sub = producer.subscribe(tls.url + "/hook")
        producer.publish()
        deliver_due(app, clock)
    groups = diagnosis(producer, sub["id"])["groups"]
    assert [g["cause"] for g in groups] == [cause], groups
    assert advice in groups[0]["advice"]


@sqlite_only
def test_failures_are_grouped_counted_and_ordered_within_the_window(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/status/500")
    for _ in range(3):
        producer.publish()
    deliver_due(app, clock)  # three 500s
    producer.client.patch(f"/api/v1/subscriptions/{sub['id']}", json={"url": receiver.url + "/status/404"},
                          headers=producer.headers())
    clock.advance(hours=1)
    deliver_due(app, clock)  # their retries: three 404s
    producer.client.patch(f"/api/v1/subscriptions/{sub['id']}", json={"url": receiver.url + "/ok"},
                          headers=producer.headers())
    producer.publish()
    deliver_due(app, clock)  # one success, which is no failure
    found = diagnosis(producer, sub["id"])
    assert (found["attempts"], found["failures"]) == (7, 6)
    groups = {g["cause"]: g for g in found["groups"]}
    assert set(groups) == {"server_error", "not_found"}
    assert (groups["server_error"]["count"], groups["server_error"]["status_codes"]) == (3, [500])
    assert groups["not_found"]["example"] == "404"
    assert [g["cause"] for g in found["groups"]] == ["not_found", "server_error"]  # a tie: the checklist's order (404 first)
    received = receiver.count()
    clock.advance(hours=25)
    later = diagnosis(producer, sub["id"])
    assert (later["attempts"], later["groups"]) == (0, [])  # older than the window
    assert receiver.count() == received  # asking sends nothing


@sqlite_only
def test_answer_times_are_said_in_ms_under_a_second_and_not_at_all_when_nothing_answered(
        app, client, auth, users, producer, receiver, clock):
    answering = producer.subscribe(receiver.url + "/status/503")
    refused = producer.subscribe(closed_port_url())
    producer.publish()
    deliver_due(app, clock)
    auth.login("owner")
    answered = client.get(f"/subscriptions/{answering['id']}").get_data(as_text=True)
    assert re.search(r"1 of 1 attempts failed; 95 % answered within \d{1,3} ms \(the limit: 10 s\)\.", answered)
    unanswered = client.get(f"/subscriptions/{refused['id']}").get_data(as_text=True)
    assert "1 of 1 attempts failed." in unanswered and "answered within" not in unanswered  # a refusal measures nothing
