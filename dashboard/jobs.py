"""RQ jobs. They take ids (here: a drain slot), never objects, and let failures be failures."""

from __future__ import annotations

import logging

from flask import current_app

from .delivery.engine import DeliveryEngine
from .queue import WorkQueue

log = logging.getLogger(__name__)


def drain(slot_token: str) -> dict:
    """Deliver what is ready until the list is empty or the time budget is spent."""
    app = current_app._get_current_object()
    work = WorkQueue.for_app(app)
    work.heartbeat(slot_token)
    try:
        stats = DeliveryEngine(app, work, app.config["CLOCK"]).drain(
            slot_token, app.config["PROMESA_DRAIN_BUDGET_SECONDS"])
    finally:
        work.release(slot_token)  # and start a successor if work is still waiting
    log.info("drained: %s", stats)
    return {"claimed": stats.claimed, "attempted": stats.attempted, "states": dict(stats.states)}
