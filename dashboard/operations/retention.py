"""Retention: how long settled work is kept, and the pruning that enforces it.

- a succeeded delivery and its attempts: `PROMESA_RETENTION_DAYS` (default 30) after it succeeded;
- a dead letter and its attempts: until it is replayed (it is then no longer dead), or
  `PROMESA_DEAD_RETENTION_DAYS` (default 90) after it was given up on; a discarded one as long;
- an event: as long as one of its deliveries is kept. Events that never had a delivery (no
  subscription wanted them, or their consumer had no endpoint yet: "replay since" reaches back this far)
  go `PROMESA_RETENTION_DAYS` after they were accepted. An event addressed to a consumer is kept as any
  other; consumers themselves are never pruned;
- a receiver check: `PROMESA_RETENTION_DAYS` after it started, except each subscription's newest,
  which its page shows as long as the subscription exists;
- a consumer portal link (and the session it opened): `PROMESA_RETENTION_DAYS` after it expired.

Pruning deletes in small batches, each its own short transaction (at most
`PROMESA_PRUNE_BATCH` deliveries with their attempts and events), and rests between batches
for `PROMESA_PRUNE_PAUSE_RATIO` times as long as the batch took, so the pipeline keeps its
share of the database and the CPU. The sweeper prunes at most `PROMESA_PRUNE_BATCHES_PER_PASS`
batches of each kind per pass; `promesa prune` runs until nothing is left to prune.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from functools import partial

from sqlalchemy import and_, bindparam, delete, exists, select
from sqlalchemy.orm import aliased

from dashboard.core.extensions import db
from dashboard.models import Attempt, Check, CheckState, Delivery, DeliveryState, Event, PortalLink

log = logging.getLogger(__name__)


@dataclass
class Pruned:
    deliveries: int = 0
    attempts: int = 0
    events: int = 0
    batches: int = 0
    checks: int = 0
    portal_links: int = 0

    def add(self, other: Pruned) -> None:
        self.deliveries += other.deliveries
        self.attempts += other.attempts
        self.events += other.events
        self.batches += other.batches
        self.checks += other.checks
        self.portal_links += other.portal_links

    def __bool__(self) -> bool:
        return bool(self.deliveries or self.events or self.checks or self.portal_links)


@dataclass(frozen=True)
class Policy:
    """What is kept, and for how long (the dashboard shows this)."""

    succeeded_days: int
    dead_days: int

    @classmethod
    def of(cls, app) -> Policy:
        return cls(app.config["PROMESA_RETENTION_DAYS"], app.config["PROMESA_DEAD_RETENTION_DAYS"])


# (state, the column that says since when it is settled): the kinds of settled delivery. A discarded one
# keeps the dead_lettered_at of the dead letter it was (ix_deliveries_discarded).
_SETTLED = ((DeliveryState.SUCCEEDED, Delivery.succeeded_at), (DeliveryState.DEAD, Delivery.dead_lettered_at),
            (DeliveryState.DISCARDED, Delivery.dead_lettered_at))


def _due_for_pruning(state: str, settled_at, limit: int, lock: bool):
    """The oldest settled deliveries of one kind past the cutoff (ix_deliveries_succeeded / _dead)."""
    query = (select(Delivery.id, Delivery.event_key)
             .where(Delivery.state == state, settled_at < bindparam("cutoff"))
             .order_by(settled_at).limit(limit))
    # Rows a replay is changing right now are left for the next batch; a replay waiting on ours finds
    # nothing dead any more.
    return query.with_for_update(skip_locked=True) if lock else query


def _prune_deliveries(state: str, settled_at, cutoff: dt.datetime, limit: int) -> Pruned:
    """One batch in one transaction: the deliveries, their attempts, then their events if nothing else
    of theirs is left."""
    session = db.session
    lock = session.get_bind().dialect.name == "postgresql"
    rows = session.execute(_due_for_pruning(state, settled_at, limit, lock), {"cutoff": cutoff}).all()
    if not rows:
        session.rollback()
        return Pruned()
    delivery_ids = [r[0] for r in rows]
    event_keys = list({r[1] for r in rows})
    attempts = session.execute(delete(Attempt).where(Attempt.delivery_id.in_(delivery_ids))).rowcount
    deliveries = session.execute(delete(Delivery).where(Delivery.id.in_(delivery_ids),
                                                        Delivery.state == state)).rowcount
    events = session.execute(delete(Event).where(
        Event.key.in_(event_keys), ~exists().where(Delivery.event_key == Event.key))).rowcount
    session.commit()
    return Pruned(deliveries, attempts, events, 1)


def _prune_unrouted_events(cutoff: dt.datetime, after: tuple | None, scan: int) -> tuple[Pruned, tuple | None]:
    """Events older than the cutoff that no subscription wanted, among the next `scan` old events after
    `after` (created_at, id): bounded work per call. Returns what was pruned and where to go on from
    (None: the end was reached)."""
    session = db.session
    window = select(Event.created_at, Event.key).where(Event.created_at < cutoff)
    if after is not None:
        window = window.where(Event.created_at >= after[0], ~and_(Event.created_at == after[0], Event.key <= after[1]))
    window = window.order_by(Event.created_at, Event.key).limit(scan)
    seen = session.execute(window).all()
    if not seen:
        session.rollback()
        return Pruned(), None
    ids = [r[1] for r in seen]
    events = session.execute(delete(Event).where(
        Event.key.in_(ids), ~exists().where(Delivery.event_key == Event.key))).rowcount
    session.commit()
    return Pruned(events=events, batches=1), (tuple(seen[-1]) if len(seen) == scan else None)


def _prune_checks(cutoff: dt.datetime, limit: int) -> Pruned:
    """One batch of finished receiver checks started before the cutoff, each subscription's newest kept."""
    session = db.session
    newer = aliased(Check)
    ids = session.scalars(select(Check.id).where(
        Check.state == CheckState.FINISHED, Check.started_at < cutoff,
        exists().where(newer.subscription_id == Check.subscription_id, newer.started_at > Check.started_at))
        .limit(limit)).all()
    if not ids:
        session.rollback()
        return Pruned()
    checks = session.execute(delete(Check).where(Check.id.in_(ids))).rowcount
    session.commit()
    return Pruned(checks=checks, batches=1)


def _prune_portal_links(cutoff: dt.datetime, limit: int) -> Pruned:
    """One batch of portal links that expired before the cutoff (their sessions ended with them)."""
    session = db.session
    ids = session.scalars(select(PortalLink.id).where(PortalLink.expires_at < cutoff).limit(limit)).all()
    if not ids:
        session.rollback()
        return Pruned()
    links = session.execute(delete(PortalLink).where(PortalLink.id.in_(ids))).rowcount
    session.commit()
    return Pruned(portal_links=links, batches=1)


class Pruner:
    """Prunes what retention no longer keeps. Keeps its place in the scan for unrouted events between
    calls, so a long-lived sweeper does not rescan the same old events every pass."""

    def __init__(self, app, clock=None):
        self.app = app
        self.clock = clock or app.config["CLOCK"]
        self.policy = Policy.of(app)
        self.batch = app.config["PROMESA_PRUNE_BATCH"]
        self.pause_ratio = app.config["PROMESA_PRUNE_PAUSE_RATIO"]
        self._events_after: tuple | None = None

    def cutoffs(self) -> dict[str, dt.datetime]:
        now = self.clock.now()
        dead = now - dt.timedelta(days=self.policy.dead_days)
        return {DeliveryState.SUCCEEDED: now - dt.timedelta(days=self.policy.succeeded_days),
                DeliveryState.DEAD: dead, DeliveryState.DISCARDED: dead}

    def _rest(self, began: float) -> None:
        if self.pause_ratio > 0:
            time.sleep((time.monotonic() - began) * self.pause_ratio)

    def _repeat(self, batch, max_batches: int | None, total: Pruned) -> None:
        """Run `batch` until it prunes nothing, or `max_batches` times, resting between batches."""
        done = 0
        while max_batches is None or done < max_batches:
            began = time.monotonic()
            pruned = batch()
            if not pruned:
                return
            total.add(pruned)
            done += 1
            self._rest(began)

    def prune(self, max_batches: int | None = None) -> Pruned:
        """Delete in batches until nothing is left to prune, or `max_batches` of each kind."""
        total = Pruned()
        cutoffs = self.cutoffs()
        with self.app.app_context():
            try:
                for state, settled_at in _SETTLED:
                    self._repeat(partial(_prune_deliveries, state, settled_at, cutoffs[state], self.batch),
                                 max_batches, total)
                self._repeat(partial(_prune_checks, cutoffs[DeliveryState.SUCCEEDED], self.batch), max_batches, total)
                self._repeat(partial(_prune_portal_links, cutoffs[DeliveryState.SUCCEEDED], self.batch), max_batches,
                             total)
                done = 0
                while max_batches is None or done < max_batches:
                    began = time.monotonic()
                    pruned, self._events_after = _prune_unrouted_events(
                        cutoffs[DeliveryState.SUCCEEDED], self._events_after, self.batch * 4)
                    total.add(pruned)
                    done += 1
                    if self._events_after is None:
                        break
                    self._rest(began)
            finally:
                db.session.remove()
        if total:
            log.info("pruned %d deliveries, %d attempts, %d events, %d receiver checks and %d portal links in %d "
                     "batches", total.deliveries, total.attempts, total.events, total.checks, total.portal_links,
                     total.batches)
        return total


def pruner_for(app, clock=None) -> Pruner:
    """The process's pruner (its place in the unrouted-events scan lives as long as the process)."""
    pruner = app.extensions.get("promesa_pruner")
    if pruner is None or (clock is not None and pruner.clock is not clock):
        pruner = app.extensions["promesa_pruner"] = Pruner(app, clock)
    return pruner
