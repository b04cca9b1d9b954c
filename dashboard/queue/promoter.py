"""The promoter: moves scheduled retries from Redis's scheduled set to the ready list as they come due.
A thread beside every delivery worker and beside the sweeper; two promoting at once is harmless (each move
is one script)."""

from __future__ import annotations

import logging
import threading

from dashboard.core.clock import unix
from dashboard.core.outages import REDIS_AWAY, redis_outage
from dashboard.queue.work import WorkQueue

log = logging.getLogger(__name__)


def promote_forever(app, stop: threading.Event, tick: float = 0.2) -> None:
    """Move scheduled retries to the ready list as they come due (runs beside every worker).
    Through a Redis outage it waits with backoff, saying so once when Redis goes and once when it is back."""
    work = WorkQueue.for_app(app)
    clock = app.config["CLOCK"]
    wait, failing = tick, False
    while not stop.wait(wait):
        try:
            work.promote_due(unix(clock.now()))
        except REDIS_AWAY as error:
            wait, failing = redis_outage.failed(error, "promoter"), True
            continue
        except Exception:  # noqa: BLE001 - a bug: log it, keep promoting
            log.exception("promoting due retries failed; trying again")
            wait = 5.0
            continue
        if failing:
            redis_outage.succeeded("promoter")
            work.kick()  # what waited in the ready list through the outage needs a drain
        wait, failing = tick, False
