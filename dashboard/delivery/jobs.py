"""RQ jobs. They take ids (here: a drain slot), never objects, and let failures be failures."""

from __future__ import annotations

import logging

from flask import current_app

from dashboard.core.outages import REDIS_AWAY, database_outage, database_unavailable
from dashboard.delivery.engine import DeliveryEngine
from dashboard.delivery.ledger import OUTAGE_WAIT_SECONDS
from dashboard.queue.work import WorkQueue

log = logging.getLogger(__name__)

_engines: dict[int, DeliveryEngine] = {}
# Drain slots a job could not give back because Redis was away: given back when it returns
# (else each would block a drain for SLOT_TTL_SECONDS after the outage).
_slots_to_release: set[str] = set()


def _engine_for(app) -> DeliveryEngine:
    """One engine per worker process: its event loop, pooled connections and pacing outlive each job."""
    engine = _engines.get(id(app))
    if engine is None:
        engine = _engines[id(app)] = DeliveryEngine(app, WorkQueue.for_app(app), app.config["CLOCK"],
                                                    keep_alive=True)
    return engine


def drain(slot_token: str) -> dict:
    """Deliver what is ready until the list is empty or the time budget is spent."""
    app = current_app._get_current_object()
    engine = _engine_for(app)
    work = engine.work
    try:
        work.heartbeat(slot_token)
        try:
            stats = engine.drain(slot_token, app.config["PROMESA_DRAIN_BUDGET_SECONDS"],
                                 app.config["PROMESA_DRAIN_LINGER_SECONDS"])
        except Exception as error:  # noqa: BLE001 - only the database being away is handled here
            if not database_unavailable(error):
                raise
            # The database is away: wait for it here, holding this slot, rather than fail and hand over to a
            # successor that fails at once (a traceback a second). What the drain held was recorded or given
            # back (engine.abandon); what it had popped but not claimed, the sweeper finds.
            database_outage.failed(error, "worker")
            if not database_outage.wait_until_back(engine.db_engine, "worker", engine.stopping, OUTAGE_WAIT_SECONDS):
                raise
            return {"claimed": 0, "attempted": 0, "states": {}, "database": "was away"}
        database_outage.succeeded("worker")
    finally:
        try:
            work.release(slot_token)  # and start a successor if work is still waiting
        except REDIS_AWAY:
            _slots_to_release.add(slot_token)  # what failed the drain (if anything) is what propagates
    log.info("drained: %s", stats)
    return {"claimed": stats.claimed, "attempted": stats.attempted, "states": dict(stats.states)}


def after_redis_outage(work: WorkQueue) -> None:
    """Redis is back: give back the slots that could not be released, and start a drain for
    whatever waits in the ready list."""
    for token in list(_slots_to_release):
        work.conn.zrem(work.drainers_key, token)
        _slots_to_release.discard(token)
    work.kick()


def stop_draining() -> None:
    """The worker was asked to stop: running drains end now as at the end of their budget
    (recording what is in flight, handing back what waits), instead of running it out."""
    for engine in _engines.values():
        engine.stopping.set()


def close_engines() -> None:
    """Close every engine's HTTP session and event loop (no "Unclosed client session" at exit)."""
    while _engines:
        _, engine = _engines.popitem()
        engine.close()
