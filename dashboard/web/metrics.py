"""`/metrics` in the Prometheus text format (prometheus-client), computed from the database and
Redis when scraped by a custom collector: every gunicorn and worker process answers the same
figures, with no multiprocess files to share. Nothing here scans a growing table:

- attempts and dead letters per subscription: the totals the sweeper folds (subscription_health)
  plus the few minutes of outcome_counts not folded yet;
- the attempt-latency histogram: the buckets the sweeper folds from new attempts (metric_counters);
- dead letters waiting and held deliveries: counts through the (subscription, state) index; the
  due backlog and its oldest age through the due index; Redis's ready list and scheduled set;
- unresolved incidents, one series each (`incident_id` label: alert annotations link to the page).

PROMESA_METRICS_TOKEN set: only `Authorization: Bearer <token>` is answered. Unset: only loopback
clients (127.0.0.1, ::1) are, and none behind a trusted proxy (where an address is what a header
says). PROMESA_METRICS_SUBSCRIPTION_LABELS subscriptions (the oldest) get
series of their own; the rest are summed under subscription="other".
"""

from __future__ import annotations

import logging
from collections import defaultdict

import redis
from flask import Blueprint, Response, abort, current_app
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.utils import floatToGoString
from sqlalchemy import func, inspect, select, text

from dashboard.core.clock import unix
from dashboard.core.extensions import db
from dashboard.models import (
    Delivery,
    DeliveryState,
    Incident,
    MetricCounter,
    OutcomeCount,
    Subscription,
    SubscriptionHealth,
    SweepMark,
    Team,
)
from dashboard.queue.work import WorkQueue
from dashboard.stats import folding
from dashboard.web.security import client_on_this_machine, metrics_token_given

log = logging.getLogger(__name__)
bp = Blueprint("metrics", __name__)
OTHER = "other"


def _allowed() -> bool:
    if current_app.config.get("PROMESA_METRICS_TOKEN"):
        return metrics_token_given()
    return client_on_this_machine()


@bp.get("/metrics")
def metrics():
    # Figures about every team: a token, or a scraper on this machine.
    if not _allowed():
        if current_app.config.get("PROMESA_METRICS_TOKEN"):
            return Response("a bearer token is required (PROMESA_METRICS_TOKEN)\n", 401,
                            {"WWW-Authenticate": 'Bearer realm="promesa-metrics"'}, mimetype="text/plain")
        abort(403, "/metrics answers loopback clients only, and behind a trusted proxy only the bearer token; "
                   "set PROMESA_METRICS_TOKEN to scrape from elsewhere")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector(current_app._get_current_object()))
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)


class Collector:
    """Reads everything at scrape time (prometheus_client calls collect() per scrape)."""

    def __init__(self, app):
        self.app = app

    def collect(self):
        now = self.app.config["CLOCK"].now()
        subs = db.session.execute(select(Subscription.id, Team.name).join(Team, Team.id == Subscription.team_id)
                                  .order_by(Subscription.created_at, Subscription.id)).all()
        limit = self.app.config["PROMESA_METRICS_SUBSCRIPTION_LABELS"]
        labelled = {sub_id: (sub_id, team) for sub_id, team in subs[:limit]}

        def labels(sub_id):
            return labelled.get(sub_id, (OTHER, OTHER))

        ids = [sub_id for sub_id, _ in subs]
        yield from self._outcomes(ids, labels)
        yield from self._waiting(ids, labels)
        yield from self._backlog(now)
        yield from self._incidents()
        yield from self._latency()
        yield from self._replays()

    def _outcomes(self, ids, labels):
        totals = defaultdict(lambda: [0, 0, 0])  # per label set: succeeded, failed, dead
        for sub_id, succeeded, failed, dead in db.session.execute(select(
                SubscriptionHealth.subscription_id, SubscriptionHealth.succeeded_total,
                SubscriptionHealth.failed_total, SubscriptionHealth.dead_total)):
            t = totals[labels(sub_id)]
            t[0], t[1], t[2] = t[0] + succeeded, t[1] + failed, t[2] + dead
        folded_until = db.session.scalar(select(SweepMark.at).where(SweepMark.name == "outcomes"))
        for chunk in folding.chunks(ids):  # the minutes the sweeper has not folded yet
            query = select(OutcomeCount.subscription_id, func.sum(OutcomeCount.succeeded),
                           func.sum(OutcomeCount.failed), func.sum(OutcomeCount.dead)) \
                .where(OutcomeCount.subscription_id.in_(chunk)).group_by(OutcomeCount.subscription_id)
            if folded_until is not None:
                query = query.where(OutcomeCount.minute >= folded_until)
            for sub_id, succeeded, failed, dead in db.session.execute(query):
                t = totals[labels(sub_id)]
                t[0], t[1], t[2] = t[0] + int(succeeded or 0), t[1] + int(failed or 0), t[2] + int(dead or 0)
        attempts = CounterMetricFamily("promesa_attempts", "Delivery attempts by outcome",
                                       labels=["subscription", "team", "outcome"])
        dead = CounterMetricFamily("promesa_dead_lettered", "Deliveries given up on (dead-lettered), replayed or not",
                                   labels=["subscription", "team"])
        for (sub, team), (succeeded, failed, died) in sorted(totals.items()):
            attempts.add_metric([sub, team, "succeeded"], succeeded)
            attempts.add_metric([sub, team, "failed"], failed)
            dead.add_metric([sub, team], died)
        yield attempts
        yield dead

    def _waiting(self, ids, labels):
        counts = defaultdict(lambda: {DeliveryState.DEAD: 0, DeliveryState.HELD: 0})
        for sub_id in ids:
            counts[labels(sub_id)]  # every labelled subscription has a series, zero included
        for chunk in folding.chunks(ids):
            for sub_id, state, n in db.session.execute(
                    select(Delivery.subscription_id, Delivery.state, func.count())
                    .where(Delivery.subscription_id.in_(chunk),
                           Delivery.state.in_((DeliveryState.DEAD, DeliveryState.HELD)))
                    .group_by(Delivery.subscription_id, Delivery.state)):
                counts[labels(sub_id)][state] += n
        dead = GaugeMetricFamily("promesa_dead_letters_waiting", "Dead letters not replayed",
                                 labels=["subscription", "team"])
        held = GaugeMetricFamily("promesa_held_deliveries", "Deliveries held while their subscription is paused "
                                 "or disabled", labels=["subscription", "team"])
        for key, by_state in sorted(counts.items()):
            dead.add_metric(list(key), by_state[DeliveryState.DEAD])
            held.add_metric(list(key), by_state[DeliveryState.HELD])
        yield dead
        yield held

    def _backlog(self, now):
        due = (Delivery.state.in_(DeliveryState.DUE), Delivery.next_attempt_at <= now)
        count, oldest = db.session.execute(select(func.count(), func.min(Delivery.next_attempt_at)).where(*due)).one()
        yield GaugeMetricFamily("promesa_due_deliveries", "Deliveries due now and not yet attempted (the backlog)",
                                value=count)
        yield GaugeMetricFamily("promesa_due_oldest_age_seconds", "How long the oldest due delivery has waited",
                                value=max(0.0, unix(now) - unix(oldest)) if oldest else 0.0)
        try:
            work = WorkQueue.for_app(self.app)
            pipe = work.conn.pipeline(transaction=False)
            pipe.zcard(work.ready_index_key)
            pipe.zcard(work.scheduled_key)
            ready, scheduled = pipe.execute()
        except (redis.RedisError, OSError):
            ready = scheduled = float("nan")  # Redis is down: say so, the database figures still stand
        yield GaugeMetricFamily("promesa_redis_ready", "Work items ready in Redis", value=ready)
        yield GaugeMetricFamily("promesa_redis_scheduled", "Work items waiting in Redis for their retry time",
                                value=scheduled)

    def _incidents(self):
        rows = db.session.execute(select(Incident.id, Incident.rule, Incident.state, Incident.subscription_id)
                                  .where(Incident.resolved_at.is_(None)).order_by(Incident.opened_at)).all()
        by_rule = GaugeMetricFamily("promesa_unresolved_incidents", "Incidents open or acknowledged, by rule",
                                    labels=["rule", "state"])
        counts = defaultdict(int)
        for _, rule, state, _ in rows:
            counts[(rule, state)] += 1
        for (rule, state), n in sorted(counts.items()):
            by_rule.add_metric([rule, state], n)
        yield by_rule
        # One series per unresolved incident (at most one per subscription and rule): an alert on it
        # links straight to /incidents/<incident_id>.
        each = GaugeMetricFamily("promesa_incident_open", "1 for each unresolved incident",
                                 labels=["incident_id", "rule", "state", "subscription"])
        for incident_id, rule, state, sub_id in rows:
            each.add_metric([incident_id, rule, state, sub_id or ""], 1)
        yield each

    def _latency(self):
        values = dict(db.session.execute(select(MetricCounter.name, MetricCounter.value)
                                         .where(MetricCounter.name.in_(folding.LATENCY_NAMES))).all())
        buckets = [(floatToGoString(ms / 1000), values.get(f"latency_le_{ms}", 0)) for ms in folding.LATENCY_BUCKETS_MS]
        buckets.append(("+Inf", values.get("latency_count", 0)))
        yield HistogramMetricFamily("promesa_attempt_duration_seconds",
                                    "How long delivery attempts took (folded by the sweeper, a pass behind)",
                                    buckets=buckets, sum_value=values.get("latency_sum_ms", 0) / 1000)

    def _replays(self):
        """Replays running: the `replays` table comes with bulk replays; absent, no series."""
        connection = db.session.connection()
        if not inspect(connection).has_table("replays"):
            return
        columns = {c["name"] for c in inspect(connection).get_columns("replays")}
        if "finished_at" in columns:
            running = db.session.scalar(text("SELECT count(*) FROM replays WHERE finished_at IS NULL"))
        elif "state" in columns:
            running = db.session.scalar(text("SELECT count(*) FROM replays WHERE state = 'running'"))
        else:
            return
        yield GaugeMetricFamily("promesa_replays_running", "Bulk replays not finished", value=running)


def init_app(app) -> None:
    app.register_blueprint(bp)
    if not app.config.get("PROMESA_METRICS_TOKEN") and int(app.config.get("PROMESA_TRUSTED_PROXIES") or 0) > 0:
        log.warning("PROMESA_METRICS_TOKEN is not set and a proxy is trusted: /metrics and /readyz?verbose=1 "
                    "answer no one without a session (an address behind a proxy is what a header says); set the token")
