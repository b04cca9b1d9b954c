"""Automatic disable (as Svix does it): a subscription whose every attempt has failed for
PROMESA_AUTO_DISABLE_DAYS (5) is disabled by `system`. The clock starts only once a failure streak
has PROMESA_AUTO_DISABLE_AFTER_FAILURES failed attempts (dashboard.stats.folding folds the streaks), and
restarts when someone enables the subscription again. The reason is shown on its page and kept in
the audit log; the sinks and the team's `promesa.subscription.disabled` subscribers are told.

Nothing is dropped: events keep arriving as held deliveries; enable (resume) and replay deliver them.
"""

from __future__ import annotations

import datetime as dt

from flask import current_app
from sqlalchemy import func, select

from dashboard import audit
from dashboard.core.clock import iso
from dashboard.core.extensions import db
from dashboard.models import (
    AuditEntry,
    Subscription,
    SubscriptionHealth,
    SubscriptionState,
)
from dashboard.operations import notifications
from dashboard.stats import outcomes
from dashboard.subscriptions.service import hold

# What the engine writes when an endpoint answers 410 Gone (dashboard.delivery.policies).
GONE_REASON = "endpoint answered 410 Gone"
# A subscription's clock restarts at the latest of these.
ENABLED_AGAIN = ("subscription.resumed", "subscription.enabled")


def check(now: dt.datetime) -> list[str]:
    """Disable what has failed for long enough, and announce what the engine disabled (410 Gone);
    returns the ids disabled here."""
    announce_engine_disables()
    days = current_app.config["PROMESA_AUTO_DISABLE_DAYS"]
    cutoff = now - dt.timedelta(days=days)
    candidates = db.session.execute(
        select(Subscription, SubscriptionHealth.disable_clock_started_at, SubscriptionHealth.failing_since,
               SubscriptionHealth.last_failure_at)
        .join(SubscriptionHealth, SubscriptionHealth.subscription_id == Subscription.id)
        .where(Subscription.state == SubscriptionState.ACTIVE,
               SubscriptionHealth.disable_clock_started_at <= cutoff)).all()
    disabled = []
    for sub, clock_started, failing_since, last_failure in candidates:
        enabled_at = db.session.scalar(select(func.max(AuditEntry.at)).where(
            AuditEntry.subscription_id == sub.id, AuditEntry.action.in_(ENABLED_AGAIN)))
        started = max(clock_started, enabled_at) if enabled_at else clock_started
        if started > cutoff or last_failure < started:
            continue  # enabled again since, and not failing long enough (or not at all) since then
        # The folded streak lags a few minutes: a success in them calls it off.
        if outcomes.totals(db.session, [sub.id], started)[sub.id].succeeded:
            continue
        reason = (f"disabled by the system: every attempt has failed for {days:g} days "
                  f"(failing since {failing_since:%Y-%m-%d %H:%M} UTC); enable it to deliver what is held")
        hold(sub, SubscriptionState.DISABLED, reason, "subscription.disabled", actor=audit.SYSTEM,
             detail={"reason": reason, "automatic": True, "failing_since": iso(failing_since)})
        notifications.subscription_disabled(sub, reason)
        disabled.append(sub.id)
    db.session.commit()
    return disabled


def announce_engine_disables() -> int:
    """The delivery engine disables a subscription whose endpoint answers 410 Gone, on its hot path,
    with no audit entry and no notification. Here, a pass later, it gets both (once: the audit entry
    written here is what marks it announced)."""
    rows = db.session.execute(
        select(Subscription).where(Subscription.state == SubscriptionState.DISABLED,
                                   Subscription.state_reason == GONE_REASON)).scalars().all()
    told = 0
    for sub in rows:
        announced = db.session.scalar(select(func.count()).select_from(AuditEntry).where(
            AuditEntry.subscription_id == sub.id, AuditEntry.action == "subscription.disabled",
            AuditEntry.at >= sub.updated_at))
        if announced:
            continue
        audit.record("subscription.disabled", subscription=sub, actor=audit.SYSTEM,
                     detail={"reason": sub.state_reason, "automatic": True})
        notifications.subscription_disabled(sub, sub.state_reason)
        told += 1
    db.session.commit()
    return told
