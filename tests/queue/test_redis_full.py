"""A Redis near or past its maxmemory (noeviction): new work keeps below the share kept for it, and what
drains need to take work out (pop, wait, beat, hand back, give a slot up) still runs past maxmemory, so a
full Redis empties instead of standing still."""

from __future__ import annotations

import redis

from dashboard.core.ids import new_ids
from dashboard.queue.work import READY_ITEM_BYTES, WORK_SHARE_OF_MAXMEMORY, NoRoom, WorkQueue, work_item


def queue_on(private_redis, max_drainers: int = 0) -> tuple[redis.Redis, WorkQueue, list[str]]:
    conn = redis.Redis(unix_socket_path=str(private_redis.socket))
    conn.config_set("maxmemory-policy", "noeviction")
    work = WorkQueue(conn, "full", "full", max_drainers=max_drainers)
    subscriptions = new_ids("sub", 10)
    work.know_team(subscriptions, 1)
    return conn, work, subscriptions


def items_for(subscriptions: list[str], n: int) -> list[str]:
    return [work_item(subscriptions[i % len(subscriptions)], delivery) for i, delivery in enumerate(new_ids("dlv", n))]


def past_maxmemory(conn: redis.Redis) -> None:
    conn.config_set("maxmemory", conn.info("memory")["used_memory"] - 1024)


def test_a_push_takes_only_what_fits_below_the_share_and_says_how_many_it_left(private_redis):
    conn, work, subscriptions = queue_on(private_redis)
    room_for = 2_000  # items, by READY_ITEM_BYTES
    used = conn.info("memory")["used_memory"]
    conn.config_set("maxmemory", int((used + room_for * READY_ITEM_BYTES) / WORK_SHARE_OF_MAXMEMORY))
    items = items_for(subscriptions, 5 * room_for)  # a sweeper's pass after a long outage: far more than fits

    try:
        work.push(items)
        raise AssertionError("a push of five times the room took it all")
    except NoRoom as full:
        left = full.left

    pushed = work.ready_count()
    assert pushed + left == len(items) and 0 < pushed <= room_for
    memory = conn.info("memory")
    assert memory["used_memory"] < WORK_SHARE_OF_MAXMEMORY * memory["maxmemory"]  # the rest of the room stays free
    assert sorted(work.ready_items()) == sorted(items[:pushed])  # the first ones, each once


def test_drains_take_work_out_of_a_redis_past_its_maxmemory(private_redis):
    conn, work, subscriptions = queue_on(private_redis, max_drainers=2)
    items = items_for(subscriptions, 3_000)
    work.max_drainers = 0  # filled without a drain job: RQ's keys would not fit later
    work.push(items)
    work.max_drainers = 2
    token = "slot-of-a-running-drain"
    conn.zadd(work.drainers_key, {token: 1e12})
    past_maxmemory(conn)
    try:
        conn.set("more", "x")
        raise AssertionError("Redis took a write past its maxmemory")
    except redis.exceptions.OutOfMemoryError:
        pass

    assert not work.kick()  # RQ cannot enqueue a drain job in a full Redis...
    assert conn.zrange(work.drainers_key, 0, -1) == [token.encode()]  # ...so the slot it took is given back
    work.schedule([(items[0], 4_000_000_000)])  # refused: it waits in the database for the sweeper
    assert conn.zcard(work.scheduled_key) == 0
    assert work.heartbeat(token) == []
    taken = work.pop_ready(100, skip_teams=["another-team"])  # the ring turns past a skipped team too
    taken += work.wait_ready(100, timeout=0.1)
    assert len(taken) == 200 and set(taken) <= set(items)

    while work.pop_ready(200):
        pass
    assert work.ready_count() == 0
    conn.set("more", "x")  # emptied, it takes writes again
