"""Long-polled pulls (issue 40) on the real web server: `promesa web`'s gunicorn workers park a waiting pull
without a thread, and run it again when its subscription's delivery arrives, when a retry falls due, or when
its wait is over. The wake-up latency is measured by `promesa bench --long-poll`, not here."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from tests.delivery.test_pull import pull_subscription
from tests.support.web_server import promesa_web

WAIT = 25


def call(url, token, method="GET", body=None, timeout=40) -> tuple[int, dict, dict]:
    request = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read()), dict(answer.headers)
    except urllib.error.HTTPError as answer:
        return answer.code, json.loads(answer.read()), dict(answer.headers)


def publish(web, token, n=1):
    for i in range(n):
        status, body, _ = call(f"{web}/api/v1/events", token, "POST",
                               {"type": "file.updated", "data": {"resource_id": f"f_{i}", "resource_version": 1}})
        assert status == 202, body


def waiting_pull(web, token, sub, limit=1, wait=WAIT) -> tuple[float, int, dict, dict]:
    """(seconds it took, status, body, headers) of one pull that waits."""
    started = time.monotonic()
    status, body, headers = call(f"{web}/api/v1/subscriptions/{sub['id']}/pull?limit={limit}&wait={wait}", token)
    return time.monotonic() - started, status, body, headers


def parked_after(web, web_process, count: int) -> None:
    """Wait until `count` pulls are parked: each then holds an established connection to the worker."""
    worker = psutil.Process(web_process.pid).children()[0]
    port = int(web.rsplit(":", 1)[1])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if sum(1 for c in worker.net_connections("tcp") if c.status == psutil.CONN_ESTABLISHED
               and c.laddr.port == port) >= count:
            time.sleep(0.3)  # the last one's request read and parked
            return
        time.sleep(0.05)
    pytest.fail(f"fewer than {count} pulls reached the worker")


def test_twelve_pulls_wait_on_four_threads_and_each_delivery_wakes_one_with_it(app, producer, tmp_path):
    sub = pull_subscription(producer, event_types=["file.*"])
    with promesa_web(app, tmp_path / "web.log") as (web, process):
        worker = psutil.Process(process.pid).children()[0]
        with ThreadPoolExecutor(max_workers=12) as pool:
            pulls = [pool.submit(waiting_pull, web, producer.token, sub) for _ in range(12)]
            parked_after(web, process, 12)
            # Twelve wait on a worker of four threads, and it still answers others meanwhile.
            status, body, _ = call(f"{web}/api/v1/subscriptions/{sub['id']}", producer.token, timeout=10)
            assert status == 200 and body["mode"] == "pull"
            assert worker.num_threads() < 12  # the pool's four, and the process's own
            assert not any(p.done() for p in pulls)

            publish(web, producer.token, 12)
            answers = [p.result(timeout=60) for p in pulls]
    assert all(status == 200 for _, status, _, _ in answers)
    assert all(seconds < WAIT / 2 for seconds, *_ in answers), [round(s, 2) for s, *_ in answers]  # woken, not timed out
    handed = [item["delivery_id"] for _, _, body, _ in answers for item in body["data"]]
    assert len(handed) == 12 == len(set(handed))  # each delivery to one pull only


def test_a_wait_with_nothing_due_ends_empty_and_a_retry_falling_due_wakes_it(app, producer, tmp_path):
    sub = pull_subscription(producer, event_types=["file.*"], retry_policy="quick-then-sweep", max_age_seconds=60)
    with promesa_web(app, tmp_path / "web.log") as (web, _):
        seconds, status, body, _ = waiting_pull(web, producer.token, sub, wait=1)
        assert (status, body["data"]) == (200, []) and seconds >= 1

        publish(web, producer.token)
        _, _, body, _ = waiting_pull(web, producer.token, sub, wait=1)
        [item] = body["data"]
        status, acked, _ = call(f"{web}/api/v1/subscriptions/{sub['id']}/pull/ack", producer.token, "POST",
                                [{"delivery_id": item["delivery_id"], "attempt": 1, "status": 500}])
        assert acked["data"][0]["state"] == "scheduled"
        # No event comes: the retry's own time (half a second on this policy) wakes the waiting pull.
        seconds, status, body, _ = waiting_pull(web, producer.token, sub)
        assert [(i["delivery_id"], i["attempt"]) for i in body["data"]] == [(item["delivery_id"], 2)]
        assert seconds < WAIT / 2


def test_a_team_over_its_waiting_pulls_is_refused_and_a_closed_wait_frees_its_place(app, producer, tmp_path):
    sub = pull_subscription(producer, event_types=["file.*"])
    with promesa_web(app, tmp_path / "web.log", PROMESA_PULL_WAITS_PER_TEAM="1") as (web, process):
        path = f"/api/v1/subscriptions/{sub['id']}/pull?wait={WAIT}"
        first = socket.create_connection(("127.0.0.1", int(web.rsplit(":", 1)[1])))
        first.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {producer.token}\r\n\r\n".encode())
        parked_after(web, process, 1)

        _, status, body, headers = waiting_pull(web, producer.token, sub)
        assert status == 429 and "1 pulls waiting" in body["error"] and headers["Retry-After"] == "1"
        assert (body["quota"], body["limit"]) == ("pull_waits_per_team", 1)

        first.close()  # the client gives up: its place is free again
        time.sleep(0.3)
        with ThreadPoolExecutor(max_workers=1) as pool:
            second = pool.submit(waiting_pull, web, producer.token, sub)
            parked_after(web, process, 1)
            publish(web, producer.token)
            _, status, body, _ = second.result(timeout=60)
        assert status == 200 and len(body["data"]) == 1


def test_a_stopping_server_answers_its_waiting_pulls_empty(app, producer, tmp_path):
    sub = pull_subscription(producer, event_types=["file.*"])
    with promesa_web(app, tmp_path / "web.log") as (web, process):
        with ThreadPoolExecutor(max_workers=3) as pool:
            pulls = [pool.submit(waiting_pull, web, producer.token, sub) for _ in range(3)]
            parked_after(web, process, 3)
            process.terminate()
            answers = [p.result(timeout=60) for p in pulls]
    assert [(status, body["data"]) for _, status, body, _ in answers] == [(200, [])] * 3


def test_without_a_parking_server_a_pull_with_wait_answers_at_once(producer):
    sub = pull_subscription(producer, event_types=["file.*"])
    resp = producer.get(f"/api/v1/subscriptions/{sub['id']}/pull?wait=25")
    assert (resp.status_code, resp.get_json()["data"]) == (200, [])
    resp = producer.get(f"/api/v1/subscriptions/{sub['id']}/pull?wait=26")
    assert resp.status_code == 400 and "wait" in resp.get_json()["error"]

