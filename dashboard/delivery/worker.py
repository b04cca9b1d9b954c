"""`promesa worker`: RQ's SimpleWorker, made to outlive Redis outages and to report failed jobs.
`promesa worker --lane <name>` runs the same worker on a lane's queue (dashboard.queue.lanes) instead.

RQ's own loop retries a failed dequeue, but any other Redis error (a heartbeat, recording a job's
result, registering the worker) ends in "found an unhandled exception, quitting" and the process
exits. Here every call of the loop that talks to Redis turns a connection error into a quiet stop
of that loop; `run()` then waits for Redis (one line when it goes, one when it is back) and starts
the loop again. A failed job still fails: `run()` returns 1 when any job failed, so
`promesa worker --burst` exits non-zero.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading

from rq import Queue, SimpleWorker
from rq.exceptions import StopRequested

from dashboard.core.outages import REDIS_AWAY, redis_outage
from dashboard.delivery import jobs
from dashboard.queue import lanes
from dashboard.queue.work import WorkQueue, separate_client

log = logging.getLogger(__name__)

# How long the command channel's thread waits for a message before it looks whether it should stop.
# RQ waits 60 s, and redis-py (8.2 on) joins that thread without a timeout at shutdown: when the thread
# reads the unsubscribe reply before stop() clears its flag, it waits the whole 60 s for a channel that
# never comes back, and the worker's exit with it (rq/rq#1613). A short wait bounds every shutdown.
COMMAND_POLL_SECONDS = 0.5


class RedisAway(StopRequested):
    """Redis went away under RQ's loop: stop it quietly (RQ ends its loop on StopRequested)."""


def _stop_if_redis_away(method):
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except REDIS_AWAY as error:
            self.redis_lost = True
            redis_outage.failed(error, f"worker {self.name}")
            raise RedisAway() from error
    return guarded


class _Queue(Queue):
    @classmethod
    def dequeue_any(cls, *args, **kwargs):
        try:
            return super().dequeue_any(*args, **kwargs)
        except REDIS_AWAY as error:  # before RQ's own handler, which logs an error on every retry
            redis_outage.failed(error, "worker")
            raise RedisAway() from error


class DeliveryWorker(SimpleWorker):
    queue_class = _Queue
    redis_lost = False
    failed_jobs = 0
    stop_event: threading.Event | None = None  # set when the process was asked to stop

    # Every step of RQ's loop that talks to Redis (dequeueing is guarded in _Queue).
    bootstrap = _stop_if_redis_away(SimpleWorker.bootstrap)
    heartbeat = _stop_if_redis_away(SimpleWorker.heartbeat)
    set_state = _stop_if_redis_away(SimpleWorker.set_state)
    check_for_suspension = _stop_if_redis_away(SimpleWorker.check_for_suspension)
    run_maintenance_tasks = _stop_if_redis_away(SimpleWorker.run_maintenance_tasks)
    execute_job = _stop_if_redis_away(SimpleWorker.execute_job)

    def dequeue_job_and_maintain_ttl(self, *args, **kwargs):
        try:
            return super().dequeue_job_and_maintain_ttl(*args, **kwargs)
        except RedisAway:  # from _Queue: remember it here too (the outage may be over by the time run() looks)
            self.redis_lost = True
            raise

    def handle_job_failure(self, *args, **kwargs):
        self.failed_jobs += 1
        return super().handle_job_failure(*args, **kwargs)

    def handle_warm_shutdown_request(self):
        jobs.stop_draining()  # a running drain ends now, recording what is in flight and handing back the rest
        lanes.stopping.set()  # a running check ends before its next request
        super().handle_warm_shutdown_request()

    def request_stop(self, signum, frame):
        if self.stop_event is not None:
            self.stop_event.set()
        try:
            super().request_stop(signum, frame)
        except REDIS_AWAY:  # RQ asks Redis whether it is busy; with Redis away, stop after this job
            self._stop_requested = True

    def subscribe(self):
        """RQ's command channel (stop a job, shut down), read with a short wait so that stopping is bounded."""
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(sleep_time=COMMAND_POLL_SECONDS, daemon=True,
                                                       exception_handler=self._pubsub_exception_handler)

    def teardown(self):
        try:
            super().teardown()
        except REDIS_AWAY:
            pass  # registering the worker's death; its registration expires by itself


def run(work: WorkQueue, burst: bool, lane: str | None = None) -> int:
    """Deliver until stopped (or, with `burst`, until the queue is empty), riding out Redis outages;
    with `lane`, run that lane's jobs instead (never a delivery). Returns the exit status: 1 if a job failed."""
    stop = threading.Event()
    lanes.stopping.clear()
    queue_name = lanes.queue_name(work.rq.name, lane) if lane else work.rq.name

    def request_stop(signum, frame):
        stop.set()
        jobs.stop_draining()
        lanes.stopping.set()

    failed = 0
    rq_conn = separate_client(work.conn)  # RQ's waits are long; the drain's calls keep the short timeout
    try:
        while not stop.is_set():
            # RQ installs its own handlers while its loop runs; ours cover the waits in between.
            signal.signal(signal.SIGTERM, request_stop)
            signal.signal(signal.SIGINT, request_stop)
            worker = DeliveryWorker([queue_name], connection=rq_conn, queue_class=_Queue)
            worker.stop_event = stop
            try:
                worker.work(burst=burst, logging_level="INFO")
            except RedisAway:  # before RQ's loop began (registering the worker)
                worker.redis_lost = True
            except REDIS_AWAY as error:
                worker.redis_lost = True
                redis_outage.failed(error, "worker")
            failed += worker.failed_jobs
            lost = worker.redis_lost or redis_outage.away
            if stop.is_set() or (burst and not lost):
                break  # stopped, or (burst) done
            if not lost:  # RQ quit on something else ("found an unhandled exception"): it is logged
                log.error("the worker loop ended by itself; starting it again")
                stop.wait(1.0)
            signal.signal(signal.SIGTERM, request_stop)
            signal.signal(signal.SIGINT, request_stop)
            if not redis_outage.wait_until_back(work.conn, "worker", stop):
                break
            jobs.after_redis_outage(work)
    finally:
        jobs.close_engines()
    return 1 if failed else 0
