"""Jobs that are not deliveries never hold a delivery worker (issue 35), on the whole of `promesa up`
(two delivery workers, a worker per lane) on PostgreSQL with real receivers on 127.0.0.1. Team A starts
receiver checks on 4 subscriptions whose endpoint answers after 9.5 s, then a replay and a discard of
large dead-letter sets; meanwhile team B publishes single events to a fast endpoint."""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.error
import urllib.request

import pytest
import sqlalchemy as sa

from dashboard.core.extensions import db
from tests.faults.conftest import query, report
from tests.support.receiver import Receiver

from ..conftest import Producer
from ..support.waiting import wait_until

SLOW_SECONDS = 9.5
CHECKED = 4
DEAD_EACH = 1500  # dead letters to replay, and as many to discard
B_EVENTS = 20


@pytest.fixture
def receivers():
    with Receiver() as slow, Receiver() as bulk, Receiver() as fast:
        yield slow, bulk, fast


def call(stack, token: str, path: str, payload=None) -> tuple[int, dict, dict]:
    """POST to the running stack: (status, JSON body, headers)."""
    request = urllib.request.Request(stack.url + path, data=json.dumps(payload or {}).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


def dead_letters(producer: Producer, event_type: str, n: int) -> None:
    """n dead letters of `event_type` (published in-process before the stack starts, then dead-lettered)."""
    for start in range(0, n, 500):
        events = [{"type": event_type, "data": {"n": i}} for i in range(start, min(n, start + 500))]
        assert producer.post("/api/v1/events/batch", {"events": events}).status_code == 202
    died = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(minutes=1)
    db.session.execute(sa.text(
        "UPDATE deliveries SET state = 'dead', dead_lettered_at = :died, next_attempt_at = NULL, attempt_count = 8, "
        "last_status_code = 500 WHERE event_key IN (SELECT key FROM events WHERE type = :type)"),
        {"died": died, "type": event_type})
    db.session.commit()


def test_checks_replays_and_discards_of_one_team_do_not_slow_another(stack, fault_app, producer, receivers):
    slow, bulk, fast = receivers
    alpha, beta = producer, Producer(fault_app.test_client(), "beta")
    checked = [alpha.subscribe(slow.url + f"/slow/{SLOW_SECONDS}", event_types=["slow.*"])["id"]
               for _ in range(CHECKED)]
    repaired = alpha.subscribe(bulk.url + "/ok", event_types=["bulk.*"])["id"]
    beta.subscribe(fast.url + "/ok", connect_timeout=1, attempt_timeout=2)
    dead_letters(alpha, "bulk.replayed", DEAD_EACH)
    dead_letters(alpha, "bulk.discarded", DEAD_EACH)
    stack.start()

    answers = [call(stack, alpha.token, f"/api/v1/subscriptions/{sub}/checks") for sub in checked]
    replay = call(stack, alpha.token, f"/api/v1/subscriptions/{repaired}/replays", {"event_types": ["bulk.replayed"]})
    discard = call(stack, alpha.token, f"/api/v1/subscriptions/{repaired}/discards",
                   {"event_types": ["bulk.discarded"]})
    published_at = {}
    for n in range(B_EVENTS):
        started = time.time()
        status, body, _ = call(stack, beta.token, "/api/v1/events", {"type": "file.updated", "data": {"n": n}})
        assert status == 202, body
        published_at[body["id"]] = started
        time.sleep(0.25)
    arrived = wait_until(lambda: fast.count() == B_EVENTS, timeout=120)
    with fast.lock:
        latencies = sorted(r.at - published_at[json.loads(r.body)["id"]] for r in fast.requests)
    p95 = latencies[int(0.95 * len(latencies)) - 1] if latencies else None
    report("isolation of jobs: team A's slow checks, replay and discard; team B's single events",
           {"b_p95_seconds": p95 and round(p95, 3), "b_max_seconds": latencies and round(latencies[-1], 3),
            "b_received": len(latencies), "checks_started": sum(status == 202 for status, _, _ in answers)})
    assert arrived and p95 <= 2.0, latencies  # every B delivery arrives, fast

    # One check of the team runs; the others were refused for the team's minute, with Retry-After.
    assert sorted(status for status, _, _ in answers) == [202] + [429] * (CHECKED - 1), answers
    assert all(int(headers["Retry-After"]) > 0 for status, _, headers in answers if status == 429)
    assert replay[0] == 202 and discard[0] == 202, (replay, discard)
    jobs = {replay[1]["id"]: DEAD_EACH, discard[1]["id"]: DEAD_EACH}
    assert wait_until(lambda: query("SELECT count(*) FROM replays WHERE id = ANY(:ids) AND state = 'finished' "
                                    "AND done = total", ids=list(jobs))[0][0] == 2, timeout=30), \
        query("SELECT id, state, done, total FROM replays")
    discarded = query("SELECT count(*) FROM deliveries WHERE state = 'discarded'")[0][0]
    assert discarded == DEAD_EACH

    # The running check ends at its own deadline (five 9.5 s answers do not fit), its answers kept.
    (check_id,) = [body["id"] for status, body, _ in answers if status == 202]
    assert wait_until(lambda: query("SELECT state FROM checks WHERE id = :id", id=check_id)[0][0] == "finished",
                      timeout=45, every=0.5)
    error, results = query("SELECT error, results FROM checks WHERE id = :id", id=check_id)[0]
    assert error.startswith("stopped after ") and "s ran out" in error, error
    results = json.loads(results) if isinstance(results, str) else results
    assert results[0] == {**results[0], "rule": "signed_accepted", "passed": True}  # what was answered is kept
