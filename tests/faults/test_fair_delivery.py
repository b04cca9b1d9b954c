"""One team never slows another (issue 28), on real services: PostgreSQL, Redis, one real worker
process, real receivers on 127.0.0.1. Team A has a subscription at the highest max_in_flight to an
endpoint that answers after 9 s, with 300 events waiting, and 100 subscriptions receiving a 500-event
batch (50,000 deliveries); meanwhile team B publishes 20 single events to a fast endpoint."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from dashboard.ingest import quotas
from dashboard.schemas import MAX_IN_FLIGHT
from tests.faults.conftest import query, report, unsettled
from tests.support.receiver import Receiver

from ..conftest import Producer
from ..support.waiting import wait_until

SLOW_SECONDS = 9
B_EVENTS = 20


@pytest.fixture
def receivers():
    with Receiver() as slow, Receiver() as bulk, Receiver() as fast:
        yield slow, bulk, fast


def post(stack, token: str, path: str, payload) -> dict:
    request = urllib.request.Request(stack.url + path, data=json.dumps(payload).encode(), method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 202
        return json.loads(resp.read())


def batch(stack, token: str, event_type: str, n: int) -> list[str]:
    events = [{"type": event_type, "data": {"n": i}} for i in range(n)]
    return [a["id"] for a in post(stack, token, "/api/v1/events/batch", {"events": events})["data"]]


def received_ids(receiver) -> set[str]:
    with receiver.lock:
        return {json.loads(r.body)["id"] for r in receiver.requests}


def test_a_slow_endpoint_and_a_fan_out_flood_of_one_team_do_not_slow_another(stack, fault_app, producer, receivers):
    slow, bulk, fast = receivers
    alpha, beta = producer, Producer(fault_app.test_client(), "beta")
    # The 1 + 100 endpoints, one past the default quota: an admin raised it.
    quotas.set_override(alpha.team, "subscriptions", 101, actor=("user", "admin@example.com"))
    alpha.subscribe(slow.url + f"/slow/{SLOW_SECONDS}", event_types=["slow.*"], max_in_flight=MAX_IN_FLIGHT)
    for _ in range(100):  # short timeouts: what the config allows for a fast endpoint
        alpha.subscribe(bulk.url + "/ok", event_types=["bulk.*"], connect_timeout=1, attempt_timeout=2)
    beta.subscribe(fast.url + "/ok", connect_timeout=1, attempt_timeout=2)
    stack.up_args = ["--workers", "1"]
    stack.env["PROMESA_DRAIN_BUDGET_SECONDS"] = "30"  # the default: a drain job as long as in production
    stack.start()

    slow_ids = batch(stack, alpha.token, "slow.thing", 300)
    bulk_ids = batch(stack, alpha.token, "bulk.thing", 500)  # 50,000 deliveries queued at once
    published_at = {}
    for n in range(B_EVENTS):
        started = time.time()
        published_at[post(stack, beta.token, "/api/v1/events", {"type": "file.updated", "data": {"n": n}})["id"]] = started
        time.sleep(0.25)
    assert wait_until(lambda: len(received_ids(fast)) == B_EVENTS, timeout=60), len(received_ids(fast))
    with fast.lock:
        latencies = sorted(r.at - published_at[json.loads(r.body)["id"]] for r in fast.requests)
    p95 = latencies[int(0.95 * B_EVENTS) - 1]
    backlog_then = unsettled()

    assert wait_until(lambda: unsettled() == 0, timeout=300, every=1), unsettled()
    assert received_ids(slow) == set(slow_ids) and received_ids(bulk) == set(bulk_ids)
    states = dict(query("SELECT state, count(*) FROM deliveries GROUP BY state"))
    assert states == {"succeeded": 300 + 50_000 + B_EVENTS}, states
    report("fair delivery: slow endpoint and fan-out flood of team A, team B's single events",
           {"b_p95_seconds": round(p95, 3), "b_max_seconds": round(latencies[-1], 3),
            "a_backlog_when_b_done": backlog_then})
    assert p95 < 2.0, latencies
