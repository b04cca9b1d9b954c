"""Signs of life from workers and sweepers: each process writes a beat to Redis every
BEAT_SECONDS, kept for TTL_SECONDS, so a process that stopped beating drops out by itself.

A beat is one key per process (`<prefix>:beat:<kind>:<host>:<pid>`, a small JSON object) and its
name in one set per deployment, so listing them costs a SMEMBERS and an MGET, never a SCAN.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

import redis

from dashboard.core.outages import REDIS_AWAY

log = logging.getLogger(__name__)

BEAT_SECONDS = 10.0
TTL_SECONDS = 30  # three missed beats: a process that is gone leaves the list within half a minute
KINDS = ("worker", "sweeper")


def _index_key(prefix: str) -> str:
    return f"{prefix}:beats"


def process_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def beat(conn: redis.Redis, prefix: str, kind: str, name: str, state: dict | None = None,
         ttl: int = TTL_SECONDS, now: float | None = None) -> None:
    """Say this process is alive, with a little state of its own (no configuration, no secrets)."""
    key = f"{prefix}:beat:{kind}:{name}"
    value = json.dumps({"kind": kind, "name": name, "at": time.time() if now is None else now, **(state or {})})
    pipe = conn.pipeline(transaction=False)
    pipe.set(key, value, ex=ttl)
    pipe.sadd(_index_key(prefix), key)
    pipe.execute()


def live(conn: redis.Redis, prefix: str) -> list[dict]:
    """Every process whose last beat has not expired, oldest kind first; forgets the expired ones."""
    keys = sorted(k.decode() if isinstance(k, bytes) else k for k in conn.smembers(_index_key(prefix)))
    if not keys:
        return []
    values = conn.mget(keys)
    gone = [key for key, value in zip(keys, values) if value is None]
    if gone:
        conn.srem(_index_key(prefix), *gone)
    beats = [json.loads(value) for value in values if value is not None]
    return sorted(beats, key=lambda b: (b.get("kind", ""), b.get("name", "")))


def forget(conn: redis.Redis, prefix: str, kind: str, name: str) -> None:
    """A process stopping cleanly leaves the list at once."""
    key = f"{prefix}:beat:{kind}:{name}"
    conn.delete(key)
    conn.srem(_index_key(prefix), key)


def beat_forever(conn: redis.Redis, prefix: str, kind: str, stop: threading.Event,
                 state: Callable[[], dict] | None = None, every: float = BEAT_SECONDS) -> None:
    """Beat until `stop` is set (run in a daemon thread). With Redis away a beat is skipped quietly:
    the loops that need Redis report the outage."""
    name = process_name()
    while True:
        try:
            beat(conn, prefix, kind, name, state() if state else None)
        except REDIS_AWAY:
            pass
        if stop.wait(every):
            break
    try:
        forget(conn, prefix, kind, name)
    except REDIS_AWAY:
        pass  # its beat expires by itself


def start(conn: redis.Redis, prefix: str, kind: str, stop: threading.Event,
          state: Callable[[], dict] | None = None) -> threading.Thread:
    thread = threading.Thread(target=beat_forever, args=(conn, prefix, kind, stop, state), daemon=True,
                              name=f"{kind}-heartbeat")
    thread.start()
    return thread
