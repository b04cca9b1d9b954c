"""One team never slows another, on real services: PostgreSQL, Redis, real worker processes, real
receivers on 127.0.0.1.

Issue 28: team A has a subscription at the highest max_in_flight to an endpoint that answers after 9 s,
with 300 events waiting, and 100 subscriptions receiving a 500-event batch (50,000 deliveries);
meanwhile team B publishes 20 single events to a fast endpoint.

Issue 35, as an outside reviewer ran it: the whole of `promesa up` (two web processes, two workers, the
sweeper), team A misbehaving three ways, team B's p95 from publish to receipt within 2 s in each. The
scenarios share one stack; each deletes its team A's backlog behind it (its requests still on the wire
are only more of what the next scenario must not feel)."""

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


# -- issue 35: isolation between teams, on one shared stack ------------------------------------------
# The reviewer's endpoint took 9.5 s; 6 s keeps well past the 2 s bound, within the 10 s attempt timeout.
A_SLOW_SECONDS = 6
HANG_SECONDS = 30  # longer than any attempt: the attempt timeout (10 s) ends it
B_P95_BOUND = 2.0


def team_b_latencies(stack, name: str, producer: Producer | None = None, consumer: str | None = None) -> list[float]:
    """Team B (or `producer`'s `consumer`) publishes B_EVENTS single events, a quarter second apart; each one's
    seconds from publish to receipt."""
    beta = producer or Producer(stack.app.test_client(), f"beta-{name}")
    addressed = {"consumer": consumer} if consumer else {}
    with Receiver() as fast:
        beta.subscribe(fast.url + "/ok", **addressed)
        published_at = {}
        for n in range(B_EVENTS):
            started = time.time()
            accepted = post(stack, beta.token, "/api/v1/events", {"type": "b.thing", "data": {"n": n}} | addressed)
            published_at[accepted["id"]] = started
            time.sleep(0.25)
        assert fast.wait_for(B_EVENTS, timeout=60), fast.count()
        with fast.lock:
            return sorted(r.at - published_at[json.loads(r.body)["id"]] for r in fast.requests)


def misbehave_and_measure(stack, slow, name: str, path: str, subscriptions: int, events: int,
                          started_after: int, then_wait: float = 0.0, **fields) -> dict:
    """Team A's `subscriptions` endpoints at `path` get `events` events each; once `started_after` of its
    requests have reached them (and `then_wait` seconds more), team B publishes. Returns B's figures;
    A's subscriptions are deleted after."""
    alpha = Producer(stack.app.test_client(), f"alpha-{name}")
    subs = [alpha.subscribe(slow.url + path, event_types=["a.*"], **fields)["id"] for _ in range(subscriptions)]
    before = slow.count(path)
    try:
        post(stack, alpha.token, "/api/v1/events/batch", {"events": [{"type": "a.thing", "data": {"n": n}}
                                                                     for n in range(events)]})
        assert wait_until(lambda: slow.count(path) - before >= started_after, timeout=30), slow.count(path)
        time.sleep(then_wait)
        latencies = team_b_latencies(stack, name)
    finally:
        for sub in subs:
            assert alpha.client.delete(f"/api/v1/subscriptions/{sub}", headers=alpha.headers()).status_code == 200
    figures = {"b_p50_seconds": round(latencies[len(latencies) // 2 - 1], 3),
               "b_p95_seconds": round(latencies[int(0.95 * len(latencies)) - 1], 3),
               "b_max_seconds": round(latencies[-1], 3)}
    report(f"isolation: {name}", figures)
    return figures


def test_slow_or_hanging_endpoints_of_one_team_do_not_slow_another(stack):
    """The reviewer's three scenarios, one after the other on one stack (one test: the suite runs in two
    processes, and three tests could each start a stack of their own)."""
    # The fault suite's drain budget (5 s, not production's 30 s): drains end theirs in every scenario,
    # and what a drain does past it is part of what is tested.
    budget = float(stack.env["PROMESA_DRAIN_BUDGET_SECONDS"])
    scenarios = {
        "fifty slow subscriptions": dict(path=f"/slow/{A_SLOW_SECONDS}", subscriptions=50, events=200,
                                         started_after=100),
        # B's first event finds A's drains past their budget.
        "one subscription at max_in_flight 64": dict(path=f"/slow/{A_SLOW_SECONDS}/64", subscriptions=1, events=300,
                                                     started_after=64, max_in_flight=MAX_IN_FLIGHT, then_wait=budget),
        "endpoints hanging after their headers": dict(path=f"/hang-after-head/{HANG_SECONDS}", subscriptions=50,
                                                      events=200, started_after=100),
    }
    stack.start()
    with Receiver() as slow:
        figures = {name: misbehave_and_measure(stack, slow, name, **how) for name, how in scenarios.items()}
    assert all(f["b_p95_seconds"] <= B_P95_BOUND for f in figures.values()), figures


# Before a subscription under its part of its team's share started as a newcomer team does: "fine" p95 3.96 s, with
# 144 of "stuck"'s requests started by then.
def test_one_consumers_slow_endpoint_does_not_slow_the_same_teams_other_consumers(stack):
    """Issue 37, inside one team: consumer "stuck" has an endpoint answering after 6 s, at the highest
    max_in_flight, with 300 events waiting; once its requests fill a worker, the same team's consumer "fine"
    publishes B_EVENTS single events. The team's slots are shared between its waiting subscriptions
    (fair_shares.FairShares.may_start), so "fine" waits for none of "stuck"'s backlog."""
    stack.start()
    alpha = Producer(stack.app.test_client(), "alpha-consumers")
    alpha.put_consumer("stuck")
    alpha.put_consumer("fine")
    path = f"/slow/{A_SLOW_SECONDS}/stuck"
    with Receiver() as slow:
        alpha.subscribe(slow.url + path, event_types=["a.*"], consumer="stuck", max_in_flight=MAX_IN_FLIGHT)
        post(stack, alpha.token, "/api/v1/events/batch", {"events": [
            {"type": "a.thing", "consumer": "stuck", "data": {"n": n}} for n in range(300)]})
        assert wait_until(lambda: slow.count(path) >= MAX_IN_FLIGHT, timeout=30), slow.count(path)
        latencies = team_b_latencies(stack, "consumers", producer=alpha, consumer="fine")
        stuck_started = slow.count(path)
    figures = {"fine_p50_seconds": round(latencies[len(latencies) // 2 - 1], 3),
               "fine_p95_seconds": round(latencies[int(0.95 * len(latencies)) - 1], 3),
               "fine_max_seconds": round(latencies[-1], 3), "stuck_requests_started_by_then": stuck_started}
    report("isolation: one consumer's slow endpoint, the same team's other consumer", figures)
    # "fine" was served within "stuck"'s first round, not after it: up's two workers start a round each.
    assert stuck_started <= 2 * MAX_IN_FLIGHT
    assert figures["fine_p95_seconds"] <= B_P95_BOUND, figures
