"""Redis full (its `maxmemory` reached, `noeviction`): ingest answers 202, the database keeping what it
accepted, or 503 with Retry-After, never 500; once there is room again the sweeper brings every due
delivery back and they are delivered."""

from __future__ import annotations

import re
import time

import pytest
import redis

from tests.faults.conftest import close_the_books, query, report, unsettled

from ..support.waiting import wait_until

# Room left under `maxmemory` once the stack is up: the filler takes it, and a little more.
ROOM_BYTES = 2 * 1024 * 1024
FILLER = b"x" * 64 * 1024
# Requests one worker keeps in flight to one endpoint, times the two workers of `promesa up`.
IN_FLIGHT_PER_ENDPOINT = 8 * 2


def test_a_full_redis_loses_nothing_and_delivers_everything_once_there_is_room(stack, producer, receiver,
                                                                               private_redis):
    producer.subscribe(receiver.url + "/ok")
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
