"""RQ jobs. They take ids (here: a drain slot), never objects, and let failures be failures."""

from __future__ import annotations

import logging

from flask import current_app

from .delivery.engine import DeliveryEngine
from .queue import WorkQueue

log = logging.getLogger(__name__)

_engines: dict[int, DeliveryEngine] = {}


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
    work.heartbeat(slot_token)
    try:
        stats = engine.drain(slot_token, app.config["PROMESA_DRAIN_BUDGET_SECONDS"],
                             app.config["PROMESA_DRAIN_LINGER_SECONDS"])
    finally:
        work.release(slot_token)  # and start a successor if work is still waiting
    log.info("drained: %s", stats)
    return {"claimed": stats.claimed, "attempted": stats.attempted, "states": dict(stats.states)}
