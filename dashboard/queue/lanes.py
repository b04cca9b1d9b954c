"""Lanes: an RQ queue of its own for each kind of job that is not a delivery, so that none of them
ever holds a delivery worker or waits ahead of a delivery.

- `checks`: receiver checks (`dashboard.jobs.receiver_check`)
- `repairs`: bulk replays and discards (`dashboard.jobs.replay`)

`promesa worker` takes only the delivery queue (PROMESA_QUEUE); `promesa worker --lane <name>` takes only
its lane's queue, `<PROMESA_QUEUE>-<name>`. A lane's concurrency is how many of its workers run; what
bounds one team in it is the job's own per-team limit (one check a minute, one replay running).
Sink notifications are no job: they are deliveries of the system team, served by the fair drain.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import redis
from flask import current_app
from rq import Queue, Worker

from dashboard.queue.work import connect

LANES = {"checks": "receiver checks", "repairs": "replays and discards"}

# Set when the worker process was asked to stop: a lane's job ends at its next step instead of running on.
stopping = threading.Event()


def queue_name(base: str, lane: str) -> str:
    return f"{base}-{lane}"


def queue(lane: str, app=None, conn: redis.Redis | None = None) -> Queue:
    """The lane's RQ queue (one per app and connection: building one costs more than an enqueue)."""
    app = app or current_app
    conn = conn or connect(app)
    made = app.extensions.setdefault("promesa_lanes", {})
    name = queue_name(app.config["PROMESA_QUEUE"], lane)
    found = made.get(name)
    if found is None or found.connection is not conn:
        found = made[name] = Queue(name, connection=conn)
    return found


def enqueue(lane: str, function: str, *args, **options):
    """Enqueue a job by dotted path on the lane's queue (after the commit that stored its row)."""
    return queue(lane).enqueue(function, *args, **options)


@dataclass(frozen=True)
class LaneState:
    name: str
    runs: str  # what its jobs are, in words
    workers: int  # RQ workers registered on its queue
    queued: int


def states(app, conn: redis.Redis | None = None) -> list[LaneState]:
    """Each lane's workers and queued jobs: a lane without a worker never runs what is queued in it."""
    out = []
    for lane, runs in LANES.items():
        q = queue(lane, app, conn)
        out.append(LaneState(lane, runs, Worker.count(queue=q), q.count))
    return out
