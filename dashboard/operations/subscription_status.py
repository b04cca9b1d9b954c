"""A subscription's current state in words, for the top of its page: what is wrong, since when,
what is open about it, what happens next, and the one action that fits."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.models import (
    Attempt,
    AuditEntry,
    Delivery,
    DeliveryState,
    Incident,
    Subscription,
    SubscriptionState,
)
from dashboard.stats import overview

# Deliveries that have been tried and are not settled well: where the latest failure is found.
_FAILED_STATES = (DeliveryState.SCHEDULED, DeliveryState.DEAD, DeliveryState.HELD)
_STATE_ACTIONS = ("subscription.paused", "subscription.disabled", "subscription.deleted")
# A failed attempt this recent says the endpoint fails now: what is replayed to it will likely die again.
RECENT_FAILURE_SECONDS = 5 * 60


@dataclass
class Status:
    sub: Subscription
    failing_since: dt.datetime | None = None
    last_success_at: dt.datetime | None = None
    last_failure: Attempt | None = None
    next_retry_at: dt.datetime | None = None
    waiting: dict = field(default_factory=dict)
    dead: int = 0
    incidents: list[Incident] = field(default_factory=list)
    # Who paused, disabled or deleted it, and when (the audit entry that did), while it is not active.
    stopped_by: AuditEntry | None = None

    @property
    def held(self) -> int:
        return self.waiting.get(DeliveryState.HELD, 0)

    @property
    def action(self) -> str | None:
        """The one action that fits now: enable, resume, pause (while failing), replay (dead letters), or none."""
        if self.sub.deleted_at is not None:
            return None
        if self.sub.state == SubscriptionState.DISABLED:
            return "enable"
        if self.sub.state == SubscriptionState.PAUSED:
            return "resume"
        if self.failing_since is not None:
            return "pause"
        return "replay" if self.dead else None


    def failing_now(self, now: dt.datetime) -> Attempt | None:
        """The latest attempt, when it failed (no success since) within RECENT_FAILURE_SECONDS or with an
        incident about the subscription open; None otherwise."""
        failure = self.last_failure
        if failure is None or (self.last_success_at is not None and self.last_success_at >= failure.attempted_at):
            return None
        recent = (now - failure.attempted_at).total_seconds() <= RECENT_FAILURE_SECONDS
        return failure if recent or self.incidents else None


def last_failure(subscription_id: str) -> Attempt | None:
    """The latest failed attempt of a delivery still owed (retrying, held or dead), or None."""
    # The owed rows of one subscription (ix_deliveries_owed), newest change first: its latest failure.
    latest = db.session.scalar(
        select(Delivery.id).where(Delivery.subscription_id == subscription_id, Delivery.state.in_(_FAILED_STATES),
                                  Delivery.attempt_count > 0)
        .order_by(Delivery.updated_at.desc(), Delivery.id.desc()).limit(1))
    if latest is None:
        return None
    return db.session.scalar(
        select(Attempt).where(Attempt.delivery_id == latest).order_by(Attempt.number.desc()).limit(1))


def status(sub: Subscription, now: dt.datetime) -> Status:
    health = overview.overview_rows(db.session, [sub], now)[0]
    out = Status(sub=sub, failing_since=health.failing_since, last_success_at=health.last_success_at,
                 waiting=dict(health.waiting))
    out.dead = out.waiting.get(DeliveryState.DEAD, 0)
    out.next_retry_at = db.session.scalar(
        select(func.min(Delivery.next_attempt_at))
        .where(Delivery.subscription_id == sub.id, Delivery.state == DeliveryState.SCHEDULED))
    out.last_failure = last_failure(sub.id)
    out.incidents = db.session.scalars(
        select(Incident).where(Incident.subscription_id == sub.id, Incident.resolved_at.is_(None))
        .order_by(Incident.opened_at)).all()
    if sub.state != SubscriptionState.ACTIVE:
        out.stopped_by = db.session.scalar(
            select(AuditEntry).where(AuditEntry.subscription_id == sub.id, AuditEntry.action.in_(_STATE_ACTIONS))
            .order_by(AuditEntry.at.desc(), AuditEntry.id.desc()).limit(1))
    return out
