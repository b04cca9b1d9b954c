"""How each subscription is doing right now: the overview's rows, worst first, and the queue above them.

Every figure is one grouped query over all the subscriptions shown (never one query per row), and
the outcome figures come from `outcome_counts` (dashboard.stats.outcomes), never from the attempts table.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass, field

import redis
from sqlalchemy import and_, func, select

from dashboard.models import (
    Delivery,
    DeliveryState,
    OutcomeCount,
    Subscription,
    SubscriptionState,
)
from dashboard.queue.work import WorkQueue
from dashboard.stats import outcomes, rollup

# Deliveries that are not delivered yet; succeeded rows grow without bound, these stay small.
WAITING_STATES = DeliveryState.OWED
SPARKLINE_HOURS = 24


@dataclass
class OverviewRow:
    sub: Subscription
    waiting: dict[str, int] = field(default_factory=dict)  # state -> deliveries
    hourly: list[outcomes.Bucket] = field(default_factory=list)  # the last 24 h, oldest first
    oldest_due_at: dt.datetime | None = None
    last_success_at: dt.datetime | None = None
    failing_since: dt.datetime | None = None

    @property
    def dead(self) -> int:
        return self.waiting.get(DeliveryState.DEAD, 0)

    @functools.cached_property
    def day(self) -> outcomes.Bucket:
        """The last 24 h summed."""
        total = outcomes.Bucket(self.hourly[0].start if self.hourly else None)
        for b in self.hourly:
            total.succeeded += b.succeeded
            total.failed += b.failed
            total.dead += b.dead
        return total

    @property
    def severity(self) -> int:
        """0 is worst: disabled or failing now; 1: dead letters waiting or paused; 2: healthy."""
        if self.sub.state == SubscriptionState.DISABLED or self.failing_since is not None:
            return 0
        if self.dead or self.sub.state == SubscriptionState.PAUSED:
            return 1
        return 2

    def sort_key(self, now: dt.datetime):
        rate = self.day.success_rate
        waited = (now - self.oldest_due_at).total_seconds() if self.oldest_due_at else 0
        return (self.severity, 1.0 if rate is None else rate, -self.dead, -waited, self.sub.url)


def overview_rows(session, subs: list[Subscription], now: dt.datetime) -> list[OverviewRow]:
    """One row of the overview per subscription, worst first."""
    rows = {s.id: OverviewRow(s) for s in subs}
    ids = list(rows)
    if not ids:
        return []
    for sub_id, *figures in session.execute(_backlog(ids, now)):
        counts, due = figures[:len(WAITING_STATES)], [at for at in figures[len(WAITING_STATES):] if at is not None]
        rows[sub_id].waiting = {state: n for state, n in zip(WAITING_STATES, counts) if n}
        rows[sub_id].oldest_due_at = min(due, default=None)
    since = now - dt.timedelta(hours=SPARKLINE_HOURS - 1)
    for sub_id, buckets in rollup.hourly(session, ids, since, now).items():
        rows[sub_id].hourly = buckets
    for sub_id, last_ok, failing in session.execute(_streaks(ids)):
        rows[sub_id].last_success_at = last_ok
        rows[sub_id].failing_since = failing
    return sorted(rows.values(), key=lambda h: h.sort_key(now))


def _backlog(ids: list[str], now: dt.datetime):
    """Per subscription: its deliveries in each waiting state, then when its oldest pending and its oldest
    scheduled delivery fell due (None when none is due yet). Each figure is a correlated count or first
    entry over one (subscription, state) range of ix_deliveries_owed, which holds the owed rows alone, so
    it reads fewer rows than the index of every delivery or one GROUP BY (which hashes every row)."""
    def of_state(state):
        return and_(Delivery.subscription_id == Subscription.id, Delivery.state == state)

    counts = [select(func.count()).select_from(Delivery).where(of_state(state))
              .correlate(Subscription).scalar_subquery() for state in WAITING_STATES]
    oldest_due = [select(func.min(Delivery.next_attempt_at)).where(of_state(state), Delivery.next_attempt_at <= now)
                  .correlate(Subscription).scalar_subquery() for state in DeliveryState.DUE]
    return select(Subscription.id, *counts, *oldest_due).where(Subscription.id.in_(ids))


def _streaks(ids: list[str]):
    """Per subscription: the minute of its last success, and the first failing minute after it (when
    it has failed since). Correlated subqueries that each read a few rows of the (subscription, minute)
    key backwards or forwards, instead of grouping a week of minutes."""
    successes = OutcomeCount.__table__.alias("oc")
    last_ok = (select(func.max(successes.c.minute))
               .where(successes.c.subscription_id == Subscription.id, successes.c.succeeded > 0)
               .correlate(Subscription).scalar_subquery())
    failures = OutcomeCount.__table__.alias("oc2")
    first_failure = (select(func.min(failures.c.minute))
                     .where(failures.c.subscription_id == Subscription.id, failures.c.failed > 0,
                            # a minute with no success after the last success; with none ever, any failure
                            and_(failures.c.minute > func.coalesce(last_ok, dt.datetime(1970, 1, 1))))
                     .scalar_subquery())
    return select(Subscription.id, last_ok.label("last_ok"), first_failure.label("failing")) \
        .where(Subscription.id.in_(ids))


@dataclass
class QueueFigures:
    ready: int | None = None
    scheduled: int | None = None
    workers: int | None = None
    oldest_due_at: dt.datetime | None = None

    @property
    def depth(self) -> int | None:
        return None if self.ready is None else self.ready + self.scheduled


def oldest_due_of(rows: list[OverviewRow]) -> dt.datetime | None:
    return min((h.oldest_due_at for h in rows if h.oldest_due_at), default=None)


def queue_figures(app, rows: list[OverviewRow]) -> QueueFigures:
    """Queue depth (Redis ready + scheduled), live RQ workers, and the oldest due delivery among `rows`.
    Redis being down shows as unknown figures, not an error page: the database still answers."""
    from rq import Worker

    figures = QueueFigures(oldest_due_at=oldest_due_of(rows))
    try:
        work = WorkQueue.for_app(app)
        pipe = work.conn.pipeline(transaction=False)
        pipe.zcard(work.ready_index_key)
        pipe.zcard(work.scheduled_key)
        figures.ready, figures.scheduled = pipe.execute()
        figures.workers = Worker.count(queue=work.rq)
    except (redis.RedisError, OSError):
        pass
    return figures
