"""The published contract: generated from live configuration, readable by the right people,
and its verification code runs (Python here, TypeScript under Node) against real deliveries."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dashboard.subscriptions import snippets
from dashboard.core.clock import unix

from tests.support.pipeline import deliver_due

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # page logic is not database logic
ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = ROOT / "node_modules"


@sqlite_only
def test_the_page_follows_the_live_configuration(client, auth, producer, receiver, users):
    sub = producer.subscribe(receiver.url + "/ok", attempt_timeout=7, connect_timeout=2,
                             event_types=["file.*"], event_versions={"file.updated": 2})
    auth.login("member")
    page = client.get(f"/subscriptions/{sub['id']}/contract").get_data(as_text=True)
    assert "connect 2.0 s, whole attempt 7.0 s" in page
    assert "8 attempts over" in page and "12 h to 24 h" in page  # the capped last delay
    assert "X-Signature: t=&lt;unix seconds&gt;,v1=" in page
    assert "file.updated v2" in page
    assert "def verify_promesa_signature" in page and "export function verifyPromesaSignature" in page
    assert sub["secret"] not in page  # the contract never shows the secret


@sqlite_only
def test_quick_then_sweep_and_standard_webhooks_are_described(client, auth, producer, receiver, users):
    sub = producer.subscribe(receiver.url + "/ok", retry_policy="quick-then-sweep", max_age_seconds=7200,
                             signature_scheme="standard-webhooks")
    auth.login("operator")
    page = client.get(f"/subscriptions/{sub['id']}/contract").get_data(as_text=True)
    assert "three quick attempts 0.5 s apart" in page and "until the event is 2 h old" in page
    assert "webhook-signature: v1,&lt;base64" in page and "def verify_standard_webhook" in page


@pytest.mark.parametrize("role, status", [("admin", 200), ("operator", 200), ("owner", 200), ("member", 200),
                                          ("outsider", 404)])
@sqlite_only
def test_who_reads_the_contract(client, auth, producer, receiver, users, role, status):
    sub = producer.subscribe(receiver.url + "/ok")
    auth.login(role)
    assert client.get(f"/subscriptions/{sub['id']}/contract").status_code == status


@sqlite_only
def test_the_api_serves_the_contract(producer, receiver):
    sub = producer.subscribe(receiver.url + "/ok")
    body = producer.get(f"/api/v1/subscriptions/{sub['id']}/contract").get_json()
    assert body["schedule"]["attempts"] == 8 and len(body["schedule"]["rows"]) == 8
    assert body["timeouts"] == {"connect": 5.0, "attempt": 10.0}
    assert "verifyPromesaSignature" in body["snippets"]["typescript"]


@sqlite_only
def test_the_contract_names_the_consumer_header(client, auth, producer, receiver, users):
    producer.put_consumer("cus_8812")
    mine = producer.subscribe(receiver.url + "/cus", consumer="cus_8812")
    own = producer.subscribe(receiver.url + "/team")
    auth.login("owner")
    page = client.get(f"/subscriptions/{mine['id']}/contract").get_data(as_text=True)
    assert "X-Promesa-Consumer: &lt;its uid&gt;" in page and "not part of the signed content" in page
    assert "every delivery carries X-Promesa-Consumer: cus_8812" in page
    payload = producer.get(f"/api/v1/subscriptions/{own['id']}/contract").get_json()["payload"]
    assert "X-Promesa-Consumer" in payload and "This endpoint is the team's own: its deliveries carry no" in payload


def real_delivery(app, producer, receiver, clock, scheme):
    sub = producer.subscribe(receiver.url + "/ok", signature_scheme=scheme)
    producer.publish("file.updated", {"resource_id": "f_1", "resource_version": 3})
    deliver_due(app, clock)
    [got] = receiver.requests
    return sub["secret"], got


def cases_for(scheme, secret, got, now):
    if scheme == "promesa":
        signature = got.headers["X-Signature"]
    else:
        signature = {k: v for k, v in got.headers.items() if k.lower().startswith("webhook-")}
    tampered = got.body.replace(b"f_1", b"f_2")
    return [  # (body, signature, secret, now) -> expected
        ((got.body, signature, secret, now), True),
        ((tampered, signature, secret, now), False),
        ((got.body, signature, "whsec_" + base64.b64encode(b"x" * 24).decode(), now), False),
        ((got.body, signature, secret, now + 301), False),  # a replay after the window
        ((got.body, signature, secret, now - 301), False),  # from the future
    ]


SCHEMES = [("promesa", "verify_promesa_signature", "verifyPromesaSignature"),
           ("standard-webhooks", "verify_standard_webhook", "verifyStandardWebhook")]


@sqlite_only
@pytest.mark.parametrize("scheme, python_name, _ts_name", SCHEMES)
def test_the_python_snippet_verifies_a_real_delivery(app, producer, receiver, clock, scheme, python_name, _ts_name):
    secret, got = real_delivery(app, producer, receiver, clock, scheme)
    namespace: dict = {}
    exec(compile(snippets.source(scheme, "python"), f"verify_{scheme}.py", "exec"), namespace)
    for args, expected in cases_for(scheme, secret, got, unix(clock.now())):
        assert namespace[python_name](*args) is expected


def node_or_skip():
    node = shutil.which("node")
    if node and (NODE_MODULES / "typescript").is_dir():
        return node
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("CI=true but Node.js or node_modules/typescript is missing: `make install` installs them")
    pytest.skip("Node.js with the typescript package is not installed (run `npm ci`)")


@sqlite_only
@pytest.mark.parametrize("scheme, _python_name, ts_name", SCHEMES)
def test_the_typescript_snippet_verifies_a_real_delivery_under_node(app, producer, receiver, clock, scheme,
                                                                    _python_name, ts_name):
    node = node_or_skip()
    secret, got = real_delivery(app, producer, receiver, clock, scheme)
    cases = cases_for(scheme, secret, got, unix(clock.now()))
    payload = [{"body_b64": base64.b64encode(body).decode(), "signature": signature, "secret": key, "now": now}
               for (body, signature, key, now), _ in cases]
    snippet = snippets.HERE / snippets.FILES[(scheme, "typescript")]
    run = subprocess.run([node, str(ROOT / "tests/support/run_snippet.mjs"), str(snippet), ts_name],
                         input=json.dumps(payload), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [expected for _, expected in cases]


def test_the_typescript_snippets_type_check_strictly():
    node_or_skip()
    files = [str(snippets.HERE / snippets.FILES[(s, "typescript")]) for s, _, _ in SCHEMES]
    run = subprocess.run([str(NODE_MODULES / ".bin/tsc"), "--noEmit", "--strict", "--target", "ES2022",
                          "--module", "NodeNext", "--moduleResolution", "NodeNext", "--types", "node", *files],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
