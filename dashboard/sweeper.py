"""The sweeper: the database is the truth, Redis is a cache of work to do.

Every pass finds the deliveries that are due, not leased by a worker, and not waiting in
Redis (ready list or scheduled set) -- work lost to a flushed Redis, a killed worker or a
crash between commit and enqueue -- and enqueues them again. A duplicate enqueue is harmless:
the worker's conditional claim lets only one attempt through.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import or_, select

from .clock import unix
from .extensions import db
from .models import Delivery, DeliveryState
from .queue import WorkQueue, work_item
from .retention import pruner_for

log = logging.getLogger(__name__)
PAGE = 5000


def sweep_once(app, clock=None) -> int:
    """One pass; returns how many deliveries were enqueued again."""
    clock = clock or app.config["CLOCK"]
    work = WorkQueue.for_app(app)
    now = clock.now()
    work.promote_due(unix(now))
    found, last_id = 0, ""
    with app.app_context():
        while True:
            rows = db.session.execute(
                select(Delivery.id, Delivery.subscription_id)
                .where(Delivery.state.in_(DeliveryState.DUE), Delivery.next_attempt_at <= now,
                       or_(Delivery.lease_expires_at.is_(None), Delivery.lease_expires_at < now),
                       Delivery.id > last_id)
                .order_by(Delivery.id).limit(PAGE)).all()
            if not rows:
                break
            last_id = rows[-1].id
            due = [work_item(r.subscription_id, r.id) for r in rows]
            queued = work.queued_among(due)
            lost = [item for item in due if item not in queued]
            if lost:
                work.push(lost)
                found += len(lost)
        db.session.remove()
    if found:
        log.warning("sweeper re-enqueued %d due deliveries that had no live job", found)
    # Retention, bounded per pass: after the re-enqueue, which matters more.
    pruner_for(app, clock).prune(app.config["PROMESA_PRUNE_BATCHES_PER_PASS"])
    return found


def promote_forever(app, stop: threading.Event, tick: float = 0.2) -> None:
    """Move scheduled retries to the ready list as they come due (runs beside every worker)."""
    work = WorkQueue.for_app(app)
    clock = app.config["CLOCK"]
    while not stop.wait(tick):
        try:
            work.promote_due(unix(clock.now()))
        except Exception:  # noqa: BLE001 - keep promoting through a Redis blip; it is logged
            log.exception("promoting due retries failed; trying again")


def sweep_forever(app, interval: float, stop: threading.Event | None = None) -> None:
    stop = stop or threading.Event()
    promoter = threading.Thread(target=promote_forever, args=(app, stop), daemon=True)
    promoter.start()
    while not stop.is_set():
        started = time.monotonic()
        try:
            sweep_once(app)
        except Exception:  # noqa: BLE001 - the next pass tries again; a dead sweeper loses retries
            log.exception("sweep failed; next pass in %.0f s", interval)
        stop.wait(max(0.0, interval - (time.monotonic() - started)))
