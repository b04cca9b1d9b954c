"""What the sweeper folds between passes, so that rules and /metrics never read days of history.

- `fold_outcomes`: the complete minutes of outcome_counts since the last pass, into each
  subscription's running totals (the /metrics counters) and its failure streak (the
  `failing_since` rule and automatic disable).
- `fold_latency`: the attempts recorded since the last pass, into a latency histogram
  (cumulative counters in metric_counters), by attempt id: the primary key, so no scan.

Each stretch is folded exactly once: a pass first moves its mark with a conditional UPDATE, in the
same transaction as what it folds; a second sweeper finds the mark moved and folds nothing.
"""

from __future__ import annotations

import datetime as dt

from flask import current_app
from sqlalchemy import case, func, insert, select, update

from dashboard.core.extensions import db
from dashboard.models import (
    Attempt,
    MetricCounter,
    OutcomeCount,
    Subscription,
    SubscriptionHealth,
    SweepMark,
)
from dashboard.stats.outcomes import minute_of

# A minute is folded once it is this far behind: an attempt is recorded seconds after it started,
# so by then no worker still adds to that minute's row.
FOLD_LAG = dt.timedelta(minutes=2)
# On the first pass, how far back the folding starts.
FIRST_FOLD = dt.timedelta(days=1)
# Upper bounds (ms) of the attempt-latency histogram's buckets; +Inf is the count.
LATENCY_BUCKETS_MS = (25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
LATENCY_NAMES = tuple(f"latency_le_{ms}" for ms in LATENCY_BUCKETS_MS) + ("latency_count", "latency_sum_ms")
CHUNK = 1000  # subscription ids per IN list
FIRST_LATENCY_FOLD = 100_000  # on the first pass, the histogram takes in at most this many earlier attempts


def mark(name: str, at: dt.datetime | None = None, position: int | None = None) -> SweepMark:
    """The named mark, created with these starting values the first time."""
    found = db.session.get(SweepMark, name)
    if found is None:
        found = SweepMark(name=name, at=at, position=position)
        db.session.add(found)
        db.session.flush()
    return found


def move_mark(found: SweepMark, **new) -> bool:
    """Move a mark from where it was read to `new`, only if nobody moved it meanwhile."""
    where = [SweepMark.name == found.name]
    where += [SweepMark.at == found.at] if found.at is not None else [SweepMark.at.is_(None)]
    where += [SweepMark.position == found.position] if found.position is not None else [SweepMark.position.is_(None)]
    moved = db.session.execute(update(SweepMark).where(*where).values(**new)
                               .execution_options(synchronize_session=False)).rowcount == 1
    if moved:
        for key, value in new.items():
            setattr(found, key, value)
    return moved


def subscription_ids() -> list[str]:
    return list(db.session.scalars(select(Subscription.id).order_by(Subscription.id)))


def chunks(ids: list[str]):
    for start in range(0, len(ids), CHUNK):
        yield ids[start:start + CHUNK]


def fold_outcomes(now: dt.datetime) -> int:
    """Fold the complete minutes since the last pass; returns how many minute rows were folded."""
    upto = minute_of(now) - FOLD_LAG  # exclusive
    found = mark("outcomes", at=upto - FIRST_FOLD)
    since = found.at
    if since >= upto or not move_mark(found, at=upto):
        db.session.commit()
        return 0
    needed = current_app.config["PROMESA_AUTO_DISABLE_AFTER_FAILURES"]
    folded = 0
    for ids in chunks(subscription_ids()):
        rows = db.session.execute(
            select(OutcomeCount.subscription_id, OutcomeCount.minute, OutcomeCount.succeeded, OutcomeCount.failed,
                   OutcomeCount.dead)
            .where(OutcomeCount.subscription_id.in_(ids), OutcomeCount.minute >= since, OutcomeCount.minute < upto)
            .order_by(OutcomeCount.subscription_id, OutcomeCount.minute)).all()
        if not rows:
            continue
        touched = sorted({r.subscription_id for r in rows})
        health = {h.subscription_id: h for h in db.session.scalars(
            select(SubscriptionHealth).where(SubscriptionHealth.subscription_id.in_(touched)))}
        for sub_id, minute, succeeded, failed, dead in rows:
            h = health.get(sub_id)
            if h is None:
                h = health[sub_id] = SubscriptionHealth(subscription_id=sub_id, succeeded_total=0, failed_total=0,
                                                        dead_total=0, streak_failures=0)
                db.session.add(h)
            h.succeeded_total += succeeded
            h.failed_total += failed
            h.dead_total += dead
            if succeeded:  # a minute with a success ends the streak (minutes are the grain)
                h.failing_since, h.streak_failures, h.disable_clock_started_at = None, 0, None
            elif failed:
                h.failing_since = h.failing_since or minute
                h.streak_failures += failed
                h.last_failure_at = minute
                if h.disable_clock_started_at is None and h.streak_failures >= needed:
                    h.disable_clock_started_at = minute
            folded += 1
    db.session.commit()
    return folded


def fold_latency() -> int:
    """Fold the attempts recorded since the last pass into the latency histogram; returns how many.

    It folds up to the highest attempt id seen by the previous pass, not this one: an attempt id is
    taken when its row is written, and a transaction still open with lower ids would otherwise be
    skipped for good. A pass later (a minute), every such transaction has long committed."""
    newest = db.session.scalar(select(func.max(Attempt.id))) or 0
    start = max(0, newest - FIRST_LATENCY_FOLD)
    folded_to = mark("latency_folded", position=start)
    seen = mark("latency_seen", position=start)
    lower, upper = folded_to.position, seen.position
    count = 0
    if upper > lower and move_mark(folded_to, position=upper):
        d = Attempt.duration_ms
        in_range = (Attempt.id > lower) & (Attempt.id <= upper)
        sums = db.session.execute(select(
            *(func.sum(case((d <= ms, 1), else_=0)) for ms in LATENCY_BUCKETS_MS),
            func.count(), func.sum(d)).where(in_range)).one()
        values = dict(zip(LATENCY_NAMES, (int(v or 0) for v in sums)))
        count = values["latency_count"]
        present = set(db.session.scalars(select(MetricCounter.name).where(MetricCounter.name.in_(LATENCY_NAMES))))
        missing = [{"name": n, "value": 0} for n in LATENCY_NAMES if n not in present]
        if missing:
            db.session.execute(insert(MetricCounter), missing)
        for name, value in values.items():
            if value:
                db.session.execute(update(MetricCounter).where(MetricCounter.name == name)
                                   .values(value=MetricCounter.value + value))
    if newest != seen.position:
        move_mark(seen, position=newest)
    db.session.commit()
    return count
