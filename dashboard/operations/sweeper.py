"""The sweeper: the database is the truth, Redis is a cache of work to do.

Every pass finds the deliveries that are due, not leased by a worker, and not waiting in
Redis (ready list or scheduled set) -- work lost to a flushed Redis, a killed worker or a
crash between commit and enqueue -- and enqueues them again. A duplicate enqueue is harmless:
the worker's conditional claim lets only one attempt through.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time

import redis
from sqlalchemy import or_, select

from dashboard.core import tracing
from dashboard.core.clock import unix
from dashboard.core.extensions import db
from dashboard.core.outages import REDIS_AWAY, database_outage, database_unavailable, redis_outage
from dashboard.delivery import pull
from dashboard.ingest import quotas
from dashboard.models import Delivery, DeliveryState, Subscription, SubscriptionMode
from dashboard.operations import autodisable, incidents, notifications, replays
from dashboard.operations.retention import pruner_for
from dashboard.queue import heartbeat
from dashboard.queue.promoter import promote_forever
from dashboard.queue.work import WorkQueue, work_item
from dashboard.stats import folding
from dashboard.subscriptions import listen_sessions, rotation
from dashboard.subscriptions.service import cancel_waiting

log = logging.getLogger(__name__)
PAGE = 5000
# Their deliveries are due in the database, and never work for the push workers: their clients pull them.
PULL_SUBSCRIPTIONS = select(Subscription.id).where(Subscription.mode == SubscriptionMode.PULL)


def evaluate_minute(app, now: dt.datetime | None = None) -> None:
    """The sweeper's minute: fold what is new, check every rule, disable what has failed for days,
    tell teams about new dead letters, audit the outcome of replays whose deliveries have all been sent, fold
    attempt latencies, count each team's owed deliveries for its
    quota. A step that fails is logged and
    the next ones still run (the next pass tries it again)."""
    now = now or app.config["CLOCK"].now()
    with app.app_context():
        for step in (folding.fold_outcomes, incidents.check_rules, autodisable.check, notifications.publish_dead_letters,
                     replays.record_outcomes, lambda _now: folding.fold_latency(), quotas.refresh):
            try:
                step(now)
            except Exception as error:  # noqa: BLE001 - one failing step must not stop the others; logged loudly
                if database_unavailable(error):
                    raise  # the database is away: the whole pass waits for it (sweep_forever)
                log.exception("incident evaluation step %s failed", getattr(step, "__name__", step))
                db.session.rollback()
        db.session.remove()


def sweep_once(app, clock=None) -> int:
    """One pass; returns how many deliveries were enqueued again."""
    with tracing.span("promesa.sweep") as span:
        found = _sweep(app, clock)
        tracing.annotate(span, **{"promesa.enqueued": found})
        return found


def _sweep(app, clock) -> int:
    clock = clock or app.config["CLOCK"]
    work = WorkQueue.for_app(app)
    now = clock.now()
    # The rules, automatic disable, notifications: once a pass, first, so a Redis outage (which stops
    # what follows) cannot hide the backlog it causes. Each of its steps logs its own failure.
    evaluate_minute(app, now)
    work.promote_due(unix(now))
    found, last_id = 0, ""
    with app.app_context():
        while True:
            rows = db.session.execute(
                select(Delivery.id, Delivery.subscription_id)
                .where(Delivery.state.in_(DeliveryState.DUE), Delivery.next_attempt_at <= now,
                       or_(Delivery.lease_expires_at.is_(None), Delivery.lease_expires_at < now),
                       Delivery.id > last_id, Delivery.subscription_id.not_in(PULL_SUBSCRIPTIONS))
                .order_by(Delivery.id).limit(PAGE)).all()
            if not rows:
                break
            last_id = rows[-1].id
            due = [work_item(r.subscription_id, r.id) for r in rows]
            queued = work.queued_among(due)
            lost = [item for item in due if item not in queued]
            if lost:
                try:
                    work.push(lost)
                except redis.exceptions.OutOfMemoryError as full:  # the rest waits for a pass with room
                    found += len(lost) - getattr(full, "left", len(lost))
                    log.warning("Redis is full: the sweeper enqueues the rest of the due deliveries when there "
                                "is room")
                    break
                found += len(lost)
        # Pull leases that ran out unacked are failed attempts (their clients fetch them again when due).
        expired = pull.expire_leases(pull.engine_for(app), now)
        if expired:
            log.warning("recorded %d pull leases that ran out unacked as failed attempts", expired)
        # Previous secrets whose grace has ended are deleted (they already sign nothing).
        rotation.delete_expired(now)
        idle = listen_sessions.delete_idle(now)
        if idle:
            log.info("deleted %d listen sessions whose client stopped pulling (the audit log names them)", len(idle))
        cancelled = cancel_for_deleted(now)
        if cancelled:
            log.warning("cancelled %d deliveries of deleted subscriptions (stored as they were deleted)", cancelled)
        db.session.remove()
    if found:
        log.warning("sweeper re-enqueued %d due deliveries that had no live job", found)
    work.kick()  # ready work left without a drain job (one that died with Redis away) gets one
    # Retention, bounded per pass: after the re-enqueue, which matters more.
    pruner_for(app, clock).prune(app.config["PROMESA_PRUNE_BATCHES_PER_PASS"])
    return found


def cancel_for_deleted(now) -> int:
    """A delivery stored while its subscription was being deleted (an ingest that routed just before) is
    held by the worker, never sent; here it ends cancelled like the others."""

    deleted = db.session.scalars(select(Subscription.id).where(Subscription.deleted_at.is_not(None))).all()
    if not deleted:
        return 0
    cancelled = cancel_waiting(deleted, now)
    db.session.commit()
    return cancelled


def sweep_forever(app, interval: float, stop: threading.Event | None = None) -> None:
    stop = stop or threading.Event()
    promoter = threading.Thread(target=promote_forever, args=(app, stop), daemon=True)
    promoter.start()
    last_pass = [None]  # when the last pass ended (the heartbeat says so)
    heartbeat.start(WorkQueue.for_app(app).conn, app.config["PROMESA_REDIS_PREFIX"], "sweeper", stop,
                    lambda: {"last_pass": last_pass[0], "database": "away" if database_outage.away else "ok",
                             "redis": "away" if redis_outage.away else "ok"})
    while not stop.is_set():
        started = time.monotonic()
        try:
            sweep_once(app)
            database_outage.succeeded("sweeper")
            last_pass[0] = time.time()
        except REDIS_AWAY as error:
            # The promoter logs the outage; try again soon, not a whole interval later.
            stop.wait(redis_outage.failed(error, "sweeper"))
            continue
        except Exception as error:  # noqa: BLE001 - the next pass tries again; a dead sweeper loses retries
            if database_unavailable(error):  # one line when it goes, one when it is back; tried again with backoff
                stop.wait(database_outage.failed(error, "sweeper"))
                continue
            log.exception("sweep failed; next pass in %.0f s", interval)
        stop.wait(max(0.0, interval - (time.monotonic() - started)))
