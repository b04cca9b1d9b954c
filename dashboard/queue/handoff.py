"""Ingest's hand-off of committed work to Redis, from a thread of its own in each web process.

A request that stored events puts their work items on an in-process queue and answers at once; one
thread per process pushes whatever has gathered in a single Redis call, at most one push every
PUSH_INTERVAL_SECONDS. Under load several requests' items go in one push, and no request waits for
Redis: the push costs CPU and a round trip, one more wait for the interpreter's lock among gunicorn's
threads. A push carries at most PUSH_ITEMS items: a large batch's work goes in turns, and requests that
arrive meanwhile go in the next push, not after the whole batch (one team's fan-out never holds back
another team's single event).

Nothing is lost by answering first: the deliveries are committed before their items are queued here,
and the sweeper enqueues any due delivery Redis does not hold (a process killed before its push, or
Redis away). gunicorn starts the thread in each worker (`web.server.post_worker_init`); elsewhere (the
test client, the CLI) `enqueue` pushes inline.

Commit first, then enqueue, whoever stores work: code on the ORM session calls `enqueue_after_commit`,
which hands the items over when that session commits (never for a rollback); ingest, which commits on a
connection of its own, calls `enqueue` once its write has committed.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import threading
import time
from collections import deque

import redis
from flask import Flask, current_app
from sqlalchemy import event as sa_event
from sqlalchemy.orm import Session

from dashboard.core import tracing
from dashboard.core.extensions import db
from dashboard.core.outages import REDIS_AWAY, redis_outage
from dashboard.queue.work import WorkQueue

log = logging.getLogger(__name__)

_STOP = object()
# Requests' worth of work items waiting for one push. Past it (Redis hung, not refusing) ingest drops
# them and says so, and the sweeper enqueues them from the database instead: memory stays bounded.
MAX_WAITING = 10_000
# Under load, pushes are at least this far apart, so that each carries several requests' work: a push
# costs nearly as much for one item as for ten. The first push after a quiet spell goes at once.
PUSH_INTERVAL_SECONDS = 0.02
_STAGED = "promesa_staged_work"  # the session's info key for work items waiting for its commit
# The most items one push carries (docs/scheduler.md); the rest of a larger request waits behind the requests
# that came meanwhile.
PUSH_ITEMS = 1000


class HandOff:
    """One app's push thread. `put` never blocks; `stop` pushes what is left, then ends the thread."""

    def __init__(self, app: Flask, push, max_waiting: int = MAX_WAITING,
                 push_interval: float = PUSH_INTERVAL_SECONDS):
        self.app = app
        self._push = push  # push(items): hands items to Redis, and never raises for Redis being away
        self._push_interval = push_interval
        self._items: queue.Queue = queue.Queue(max_waiting)
        self._thread = threading.Thread(target=self._run, name="promesa-handoff", daemon=True)
        self._dropping = False

    def start(self) -> HandOff:
        self._thread.start()
        atexit.register(self.stop)  # a worker that exits cleanly (restart, SIGTERM) pushes what it holds
        return self

    def put(self, items: list[str]) -> None:
        try:
            self._items.put_nowait(items)
            self._dropping = False
        except queue.Full:
            if not self._dropping:  # once per episode, not once per request
                self._dropping = True
                log.error("the hand-off to Redis is %d requests behind; new work waits for the sweeper",
                          self._items.maxsize)

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread.is_alive():
            try:
                self._items.put(_STOP, timeout=timeout)
            except queue.Full:
                return  # a hung push: what is queued waits for the sweeper
            self._thread.join(timeout)

    def _run(self) -> None:
        stopping = False
        next_push = 0.0
        line: deque[list[str]] = deque()  # requests' items not pushed yet, in turn
        rest: list[str] = []  # what the last push left of a large request
        bound = self._items.maxsize or float("inf")  # requests held here at most: the queue's bound
        while True:
            arrived = []
            if not line and not rest:
                if stopping:
                    return
                arrived.append(self._items.get())
                if (early := next_push - time.monotonic()) > 0 and arrived[0] is not _STOP:
                    time.sleep(early)  # the last push was a moment ago: let more gather for this one
            with contextlib.suppress(queue.Empty):
                while len(line) + len(arrived) < bound:  # what queued meanwhile joins the line
                    arrived.append(self._items.get_nowait())
            stopping = stopping or any(items is _STOP for items in arrived)
            line.extend(items for items in arrived if items is not _STOP)
            if rest:
                line.append(rest)  # behind the requests that arrived while its first part was pushed
            gathered, rest = _take(line, PUSH_ITEMS)
            if gathered:
                try:
                    with self.app.app_context():
                        self._push(gathered)
                except Exception:  # noqa: BLE001 - the thread must outlive any one push; the sweeper has them
                    log.exception("could not hand %d deliveries to Redis; the sweeper will", len(gathered))
                next_push = time.monotonic() + self._push_interval


def _take(line: deque[list[str]], limit: int) -> tuple[list[str], list[str]]:
    """Up to `limit` items of the requests in line, oldest first, and what did not fit of the last one taken."""
    taken: list[str] = []
    while line and len(taken) < limit:
        items = line.popleft()
        room = limit - len(taken)
        if len(items) > room:
            return taken + items[:room], items[room:]
        taken += items
    return taken, []


def start(app) -> None:
    """Push this process's ingested work from a thread (gunicorn's post_worker_init calls this)."""
    app.extensions["promesa_handoff"] = HandOff(app, push_now).start()


def thread_of(app: Flask) -> HandOff | None:
    """This process's hand-off thread, if it has one (under gunicorn)."""
    return app.extensions.get("promesa_handoff")


def enqueue(items: list[str], team_id: int | None = None, modes: dict[str, str] | None = None) -> None:
    """Hand committed deliveries (work items) to the workers: through this process's hand-off thread when
    it has one (under gunicorn), else at once. If Redis is down the sweeper enqueues them later.
    `modes`: {subscription id: push or pull} the caller read with them (ingest's routing)."""
    if not items:
        return
    if team_id is not None:  # the caller knows whose work it is: the push files it without a lookup
        WorkQueue.for_app().know_team({item.rpartition("|")[0] for item in items}, team_id)
    if modes:  # ... and which of them are pulled by their own clients: the push leaves those out without a lookup
        WorkQueue.for_app().know_modes(modes)
    thread = thread_of(current_app)
    if thread is not None:
        thread.put(items)
        return
    push_now(items)


def enqueue_after_commit(items: list[str]) -> None:
    """Hand these deliveries (work items) to the workers when the current session commits the transaction
    that stores them, and never if it rolls back: a worker must not look for a row that is not there yet."""
    if items:
        db.session().info.setdefault(_STAGED, []).extend(items)


@sa_event.listens_for(Session, "after_commit")
def _enqueue_staged(session):
    items = session.info.pop(_STAGED, None)
    if items:
        enqueue(items)


@sa_event.listens_for(Session, "after_rollback")
def _drop_staged(session):
    session.info.pop(_STAGED, None)


class RedisFull:
    """One line when Redis refuses ingest's work for want of memory (its `maxmemory` reached, `noeviction`),
    one when it takes it again: not a traceback per push while it is full."""

    def __init__(self):
        self._lock = threading.Lock()
        self._since: float | None = None
        self._left_out = 0  # deliveries the pushes could not hand over meanwhile

    def refused(self, count: int) -> None:
        with self._lock:
            self._left_out += count
            if self._since is None:
                self._since = time.monotonic()
                log.error("ingest: Redis is full (at its maxmemory, or at the share of it kept for new work); "
                          "accepted deliveries wait in the database, and the sweeper enqueues them when there is room")

    def took(self) -> None:
        if self._since is None:  # the common case, without the lock
            return
        with self._lock:
            if self._since is not None:
                log.warning("ingest: Redis takes work again after %.1f s full; the sweeper enqueues the %d "
                            "deliveries left in the database meanwhile", time.monotonic() - self._since,
                            self._left_out)
                self._since, self._left_out = None, 0


redis_full = RedisFull()


def push_now(items: list[str]) -> None:
    """Push work items to Redis now; a Redis that is away or full is logged once, not raised (the sweeper has
    them)."""
    try:
        with tracing.span("promesa.handoff", "producer", **{"promesa.deliveries": len(items)}):
            WorkQueue.for_app().push(items)
    except REDIS_AWAY as error:  # accepted work is in the database: never fail the producer for Redis
        redis_outage.failed(error, "ingest")  # one line per outage, not a traceback per request
        return
    except redis.exceptions.OutOfMemoryError as full:
        redis_full.refused(getattr(full, "left", len(items)))
        return
    except (redis.RedisError, OSError):
        log.warning("could not enqueue %d deliveries; the sweeper will", len(items), exc_info=True)
        return
    redis_outage.succeeded("ingest")
    redis_full.took()
