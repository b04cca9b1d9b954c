"""How each subscription is doing right now: the overview's rows, worst first, and the queue above them.

Every figure is one grouped query over all the subscriptions shown (never one query per row), and
the outcome figures come from `outcome_counts` (dashboard.stats.outcomes), never from the attempts table.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass, field

import redis
from sqlalchemy import and_, func, select, union

from dashboard.models import (
    TEST_EVENT_TYPE,
    Consumer,
    ConsumerState,
    Delivery,
    DeliveryState,
    Event,
    Incident,
    OutcomeCount,
    Subscription,
    SubscriptionHealth,
    SubscriptionState,
)
from dashboard.queue.work import WorkQueue
from dashboard.stats import outcomes, rollup

# Deliveries that are not delivered yet; succeeded rows grow without bound, these stay small.
WAITING_STATES = DeliveryState.OWED
SPARKLINE_HOURS = 24


# Deliveries that have not reached their receiver although they were due: retrying, paused or given up.
UNDELIVERED_STATES = (DeliveryState.SCHEDULED, DeliveryState.HELD, DeliveryState.DEAD)
# Below this share of events delivered (or of attempts succeeded, while events go undelivered), a figure is red.
HEALTHY_SHARE = 0.95
_STATE_RANK = {SubscriptionState.DISABLED: 0, SubscriptionState.PAUSED: 1}


@dataclass
class OverviewRow:
    sub: Subscription
    waiting: dict[str, int] = field(default_factory=dict)  # state -> deliveries
    hourly: list[outcomes.Bucket] = field(default_factory=list)  # the last 24 h, oldest first
    oldest_due_at: dt.datetime | None = None
    last_success_at: dt.datetime | None = None
    failing_since: dt.datetime | None = None
    incident: Incident | None = None  # its unresolved incident, if one is open
    undelivered_tests: int = 0  # test events among the undelivered deliveries: no health figure counts them

    @property
    def dead(self) -> int:
        return self.waiting.get(DeliveryState.DEAD, 0)

    @functools.cached_property
    def day(self) -> outcomes.Bucket:
        """The last 24 h summed (test events are never counted: dashboard.models.TEST_EVENT_TYPE)."""
        total = outcomes.Bucket(self.hourly[0].start if self.hourly else None)
        for b in self.hourly:
            total.succeeded += b.succeeded
            total.failed += b.failed
            total.dead += b.dead
        return total

    @property
    def undelivered(self) -> int:
        """Events due to this endpoint and not delivered now: retrying, held, or dead letters."""
        return max(0, sum(self.waiting.get(state, 0) for state in UNDELIVERED_STATES) - self.undelivered_tests)

    @property
    def delivered_share(self) -> float | None:
        """Of the events delivered in the last 24 h and those not delivered now, the share delivered:
        an endpoint that failed many attempts but delivered every event in the end is at 100 %."""
        delivered = self.day.succeeded
        return delivered / (delivered + self.undelivered) if delivered + self.undelivered else None

    @property
    def events_unhealthy(self) -> bool:
        return self.delivered_share is not None and self.delivered_share < HEALTHY_SHARE

    @property
    def attempts_unhealthy(self) -> bool:
        """A low attempt rate needs attention while events go undelivered, not once every one arrived."""
        rate = self.day.success_rate
        return rate is not None and rate < HEALTHY_SHARE and (self.undelivered > 0 or self.failing_since is not None)

    @property
    def severity(self) -> int:
        """0 is worst: an open incident, disabled or failing now; 1: dead letters, paused, events undelivered;
        2: healthy."""
        if self.incident is not None or self.sub.state == SubscriptionState.DISABLED \
                or self.failing_since is not None:
            return 0
        if self.dead or self.sub.state == SubscriptionState.PAUSED or self.events_unhealthy:
            return 1
        return 2

    def sort_key(self, now: dt.datetime):
        """What needs a person now comes first: an open incident, then dead letters (the most first), then
        failing (the longest first), disabled or paused, then the share of events delivered and of attempts."""
        share, rate = self.delivered_share, self.day.success_rate
        waited = (now - self.oldest_due_at).total_seconds() if self.oldest_due_at else 0
        return (self.incident is None, -self.dead, self.failing_since is None, self.failing_since or now,
                _STATE_RANK.get(self.sub.state, 2), 1.0 if share is None else share, 1.0 if rate is None else rate,
                -waited, self.sub.target)


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
    for incident in session.scalars(select(Incident).where(Incident.subscription_id.in_(ids),
                                                           Incident.resolved_at.is_(None))):
        rows[incident.subscription_id].incident = incident
    undelivered = [sub_id for sub_id, row in rows.items() if row.undelivered]
    if undelivered:
        for sub_id, n in session.execute(_undelivered_tests(undelivered)):
            rows[sub_id].undelivered_tests = n
    return sorted(rows.values(), key=lambda h: h.sort_key(now))


def _undelivered_tests(ids: list[str]):
    """Per subscription, its undelivered deliveries of test events, found from the few events of that type."""
    return (select(Delivery.subscription_id, func.count())
            .join(Event, Event.key == Delivery.event_key)
            .where(Event.type == TEST_EVENT_TYPE, Delivery.subscription_id.in_(ids),
                   Delivery.state.in_(UNDELIVERED_STATES))
            .group_by(Delivery.subscription_id))


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


@dataclass
class ConsumerHealth:
    """A consumer's endpoints summed up for the consumers list: how many, the worst, their dead letters."""
    endpoints: int = 0
    severity: int | None = None  # the worst of its endpoints' OverviewRow.severity; None with no endpoint
    dead: int = 0
    failing: int = 0  # endpoints at severity 0: an open incident, disabled or failing now


def consumer_health(rows: list[OverviewRow]) -> dict[int, ConsumerHealth]:
    """Per consumer id, its endpoints' rows summed up (rows of no consumer are left out)."""
    health: dict[int, ConsumerHealth] = {}
    for row in rows:
        if row.sub.consumer_id is None:
            continue
        summary = health.setdefault(row.sub.consumer_id, ConsumerHealth())
        summary.endpoints += 1
        summary.severity = row.severity if summary.severity is None else min(summary.severity, row.severity)
        summary.dead += row.dead
        summary.failing += row.severity == 0
    return health


def consumer_endpoints_needing_a_person(team_clauses: list):
    """The ids (a SELECT) of the live consumer endpoints of the teams `team_clauses` keep that need a person now:
    paused or disabled, or their consumer disabled; an open incident; dead letters owed; a failing streak
    (subscription_health.failing_since). Found in the database, never by loading every consumer endpoint: open
    incidents and dead letters from their partial indexes; states and streaks from their columns (no index holds
    them); each joined to subscriptions by key."""
    # Uncorrelated: the overview narrows its own query of subscriptions with it.
    ids = select(Subscription.id).where(Subscription.deleted_at.is_(None), Subscription.consumer_id.is_not(None),
                                        *team_clauses).correlate(None)
    return union(
        ids.where(Subscription.state != SubscriptionState.ACTIVE),
        ids.join(Consumer, Consumer.id == Subscription.consumer_id).where(Consumer.state == ConsumerState.DISABLED),
        ids.join(Incident, Incident.subscription_id == Subscription.id).where(Incident.resolved_at.is_(None)),
        ids.where(Subscription.id.in_(
            select(Delivery.subscription_id).where(Delivery.state == DeliveryState.DEAD).distinct())),
        ids.join(SubscriptionHealth, SubscriptionHealth.subscription_id == Subscription.id)
        .where(SubscriptionHealth.failing_since.is_not(None)),
    )


def consumer_endpoint_count(session, team_clauses: list) -> int:
    """Live consumer endpoints of the teams `team_clauses` keep: one count over ix_subscriptions_team_consumer."""
    return session.scalar(select(func.count()).select_from(Subscription).where(
        *team_clauses, Subscription.consumer_id.is_not(None), Subscription.deleted_at.is_(None)))


def oldest_due(session, team_clauses: list, now: dt.datetime) -> dt.datetime | None:
    """When the oldest due delivery of the teams `team_clauses` keep fell due, listed endpoint or not: the due
    deliveries' index in time order, up to the first of these teams'."""
    of_teams = [Delivery.subscription_id.in_(select(Subscription.id).where(*team_clauses))] if team_clauses else []
    return session.scalar(select(func.min(Delivery.next_attempt_at)).where(
        Delivery.state.in_(DeliveryState.DUE), Delivery.next_attempt_at <= now, *of_teams))
