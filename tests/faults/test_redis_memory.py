"""Redis memory: what one team's owed deliveries take of it (the default `queued_deliveries` quota keeps
it under the budget docs/operating.md states), and Redis full (its `maxmemory` reached, `noeviction`):
ingest answers 202, the database keeping what it accepted, or 503 with Retry-After, never 500; once there
is room again the sweeper brings every due delivery back and they are delivered."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

import pytest
import redis

from dashboard.core.ids import new_ids
from dashboard.ingest.quotas import QUOTAS
from dashboard.queue.work import WorkQueue, work_item
from tests.faults.conftest import close_the_books, query, report, unsettled

from ..support.waiting import wait_until

# What docs/operating.md promises one team's owed deliveries take of Redis at the default quota, at most.
TEAM_BUDGET_BYTES = 32 * 1024 * 1024
# Deliveries pushed to measure the bytes each takes: enough that Redis's allocation steps average out.
SAMPLE = 20_000
# Room left under `maxmemory` once the stack is up: the filler takes it, and a little more.
ROOM_BYTES = 2 * 1024 * 1024
FILLER = b"x" * 64 * 1024
# Above what the stack already uses: 90 % of the total leaves room for about a thousand ready deliveries,
# far fewer than the batches below bring at once for a slow endpoint.
OWN_WORK_ROOM_BYTES = 512 * 1024
# Requests one worker keeps in flight to one endpoint, times the two workers of `promesa up`.
IN_FLIGHT_PER_ENDPOINT = 8 * 2


def publish_batches(stack, token: str, batches: int, size: int) -> tuple[list[str], list[int]]:
    """POST `batches` batches of `size` events; the ids accepted and each batch's status."""
    accepted, statuses = [], []
    for b in range(batches):
        body = json.dumps({"events": [{"type": "file.updated", "data": {"n": b * size + i}}
                                      for i in range(size)]}).encode()
        request = urllib.request.Request(stack.url + "/api/v1/events/batch", data=body, method="POST", headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                statuses.append(answer.status)
                accepted += [event["id"] for event in json.loads(answer.read())["data"]]
        except urllib.error.HTTPError as answer:
            statuses.append(answer.code)
    return accepted, statuses


def test_a_full_redis_loses_nothing_and_delivers_everything_once_there_is_room(stack, producer, receiver,
                                                                               private_redis):
    """Two ways to fill it: something else takes its memory (room returns when that is deleted), and
    Promesa's own work outgrows a small maxmemory (its workers must still be able to drain it)."""
    fast = producer.subscribe(receiver.url + "/ok")
    stack.start()
    before, answers = stack.publish(producer.token, 20)
    assert answers == {202: 20}
    assert wait_until(lambda: unsettled() == 0, timeout=60), unsettled()

    conn = redis.Redis(unix_socket_path=str(private_redis.socket))
    conn.config_set("maxmemory-policy", "noeviction")
    conn.config_set("maxmemory", conn.info("memory")["used_memory"] + ROOM_BYTES)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        for _ in range(2 * ROOM_BYTES // len(FILLER)):  # appended until Redis refuses
            conn.append("filler", FILLER)

    started = time.monotonic()
    during, full_answers = stack.publish(producer.token, 50)
    full_for = time.monotonic() - started
    assert set(full_answers) <= {202, 503}, full_answers  # never a 500
    stored = query("SELECT count(*) FROM events WHERE id = ANY(:ids)", ids=during)[0][0]
    assert stored == len(during)
    assert conn.zcard("faults:ready_index") == 0  # none of them reached Redis: the sweeper must bring them

    conn.delete("filler")  # room again
    after, answers = stack.publish(producer.token, 20)
    assert answers == {202: 20}
    accepted = before + during + after
    assert wait_until(lambda: unsettled() == 0, timeout=60), unsettled()
    assert stack.process.poll() is None
    log = stack.log()
    figures = close_the_books(accepted, receiver, in_flight_bound=IN_FLIGHT_PER_ENDPOINT)
    figures.update(answers=dict(full_answers), full_seconds=round(full_for, 1),
                   tracebacks=log.count("Traceback (most recent call last)"),
                   full_lines=len(re.findall("Redis is full", log)))
    report("redis full (maxmemory, noeviction) during ingest", figures)
    # Ingest says it once per web process and episode, not a traceback per push.
    assert "could not enqueue" not in log, log[-5000:]
    assert 1 <= figures["full_lines"] <= 4 and "Redis takes work again" in log, log[-5000:]
    assert figures["answers"] == {202: 50}  # the database is the truth: every event was accepted

    # Promesa's own work: more than fits. New work stops short of maxmemory, so drains still start and
    # free room, and the sweeper brings the rest from the database.
    # A slow endpoint instead: its work outlives a drain's budget, so new drains must start.
    assert producer.client.delete(f"/api/v1/subscriptions/{fast['id']}", headers=producer.headers()).status_code == 200
    producer.subscribe(receiver.url + "/slow/0.05")
    conn.config_set("maxmemory", conn.info("memory")["used_memory"] + OWN_WORK_ROOM_BYTES)
    started = time.monotonic()
    own, statuses = publish_batches(stack, producer.token, 30, 100)
    assert statuses == [202] * 30
    assert wait_until(lambda: unsettled() == 0, timeout=90), unsettled()
    assert len(re.findall("Redis is full", stack.log())) > figures["full_lines"]  # ingest did find it full
    figures = close_the_books(accepted + own, receiver, in_flight_bound=IN_FLIGHT_PER_ENDPOINT)
    figures.update(seconds=round(time.monotonic() - started, 1), maxmemory=conn.config_get("maxmemory"))
    report("redis filled by promesa's own work", figures)


def test_the_default_owed_ceiling_keeps_one_team_within_its_redis_budget(private_redis):
    conn = redis.Redis(unix_socket_path=str(private_redis.socket))
    work = WorkQueue(conn, "sizing", "sizing", max_drainers=0)  # no drain job: the work stays where it is put
    subscriptions = new_ids("sub", 100)
    work.know_team(subscriptions, 1)
    items = [work_item(subscriptions[n % len(subscriptions)], delivery)
             for n, delivery in enumerate(new_ids("dlv", SAMPLE))]

    def bytes_each(put) -> float:
        conn.flushall()
        before = conn.info("memory")["used_memory"]
        put()
        return (conn.info("memory")["used_memory"] - before) / SAMPLE

    ready = bytes_each(lambda: work.push(items))  # the ready queues and their index
    scheduled = bytes_each(lambda: work.schedule([(item, 4_000_000_000) for item in items]))
    report("redis bytes per owed delivery", {"ready": round(ready), "scheduled": round(scheduled)})
    assert QUOTAS["queued_deliveries"].default * max(ready, scheduled) <= TEAM_BUDGET_BYTES
