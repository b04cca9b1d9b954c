"""Outcomes per hour, for the dashboard's charts, read from hours rolled up once instead of minutes.

`outcome_counts` has a row per subscription per minute: the overview's 24 hours of 100
subscriptions are 144,000 of them, too many to sum on every poll. An hour that is over (and
SETTLE past, so no attempt of it is still being recorded) never changes again: the first page that
needs it sums it, for every subscription at once, into `outcome_hours`, with a marker row saying
the hour is done. After that, a chart reads one row per subscription per hour, plus the minutes of
the hour still going on.
"""

from __future__ import annotations

import datetime as dt
import math

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite

from dashboard.models import OutcomeCount, OutcomeHour, Subscription
from dashboard.stats.outcomes import Bucket

HOUR = dt.timedelta(hours=1)
# Attempts are recorded seconds after they start; an hour this far past its end has all of its minutes.
SETTLE = dt.timedelta(minutes=5)
DONE = "*"  # the subscription_id of the row that marks an hour as rolled up

OUTCOME_COUNTS = OutcomeCount.__table__
OUTCOME_HOURS = OutcomeHour.__table__
SUBSCRIPTIONS = Subscription.__table__
_COUNTERS = ("succeeded", "failed", "dead", "duration_ms")


def hour_of(when: dt.datetime) -> dt.datetime:
    return when.replace(minute=0, second=0, microsecond=0)


def _hour_of_minute(dialect: str):
    if dialect == "postgresql":
        return func.date_trunc("hour", OUTCOME_COUNTS.c.minute)
    # SQLAlchemy's own text form of a DateTime.
    return func.strftime("%Y-%m-%d %H:00:00.000000", OUTCOME_COUNTS.c.minute)


def _insert(dialect: str):
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(OUTCOME_HOURS)


def roll_up(engine, start: dt.datetime, end: dt.datetime) -> int:
    """Sum every hour from `start` to `end` (hour starts, end excluded) not yet rolled up. Returns how many."""
    if end <= start:
        return 0
    with engine.begin() as conn:
        done = set(conn.execute(select(OUTCOME_HOURS.c.hour).where(
            OUTCOME_HOURS.c.subscription_id == DONE, OUTCOME_HOURS.c.hour >= start,
            OUTCOME_HOURS.c.hour < end)).scalars())
        count = int((end - start) / HOUR)
        missing = [h for h in (start + i * HOUR for i in range(count)) if h not in done]
        if not missing:
            return 0
        dialect = conn.dialect.name
        hour = _hour_of_minute(dialect)
        # Joined to subscriptions, so the database reads each one's minutes by its (subscription, minute) key.
        sums = (select(OUTCOME_COUNTS.c.subscription_id, hour,
                       *(func.sum(OUTCOME_COUNTS.c[name]) for name in _COUNTERS))
                .join(SUBSCRIPTIONS, SUBSCRIPTIONS.c.id == OUTCOME_COUNTS.c.subscription_id)
                .where(OUTCOME_COUNTS.c.minute >= missing[0], OUTCOME_COUNTS.c.minute < missing[-1] + HOUR)
                .group_by(OUTCOME_COUNTS.c.subscription_id, hour))
        conn.execute(_insert(dialect).from_select(["subscription_id", "hour", *_COUNTERS], sums)
                     .on_conflict_do_nothing())  # hours already there, or rolled up by another request meanwhile
        conn.execute(_insert(dialect).on_conflict_do_nothing(),
                     [{"subscription_id": DONE, "hour": h, **dict.fromkeys(_COUNTERS, 0)} for h in missing])
    return len(missing)


def hourly(session, subscription_ids: list[str], since: dt.datetime, now: dt.datetime) -> dict[str, list[Bucket]]:
    """Per subscription, one Bucket per hour from the hour of `since` to the current one, empty ones included:
    the same answer as outcomes.series(..., bucket_seconds=3600), at a fraction of the rows."""
    if not subscription_ids:
        return {}
    start = hour_of(since)
    settled = max(start, hour_of(now - SETTLE))
    roll_up(session.get_bind(), start, settled)
    found: dict[tuple[str, dt.datetime], tuple] = {}
    for sub, at, *values in session.execute(
            select(OUTCOME_HOURS.c.subscription_id, OUTCOME_HOURS.c.hour,
                   *(OUTCOME_HOURS.c[name] for name in _COUNTERS))
            .where(OUTCOME_HOURS.c.subscription_id.in_(subscription_ids), OUTCOME_HOURS.c.hour >= start,
                   OUTCOME_HOURS.c.hour < settled)):
        found[(sub, at)] = values
    hour = _hour_of_minute(session.get_bind().dialect.name).label("hour")
    recent = (select(OUTCOME_COUNTS.c.subscription_id, hour,
                     *(func.sum(OUTCOME_COUNTS.c[name]) for name in _COUNTERS))
              .where(OUTCOME_COUNTS.c.subscription_id.in_(subscription_ids), OUTCOME_COUNTS.c.minute >= settled,
                     OUTCOME_COUNTS.c.minute < now + HOUR)
              .group_by(OUTCOME_COUNTS.c.subscription_id, hour))
    for sub, at, *values in session.execute(recent):
        at = at if isinstance(at, dt.datetime) else dt.datetime.fromisoformat(at)
        found[(sub, at)] = values
    count = max(1, math.ceil((now - start) / HOUR)) if now > start else 1
    hours = [start + i * HOUR for i in range(count)]
    return {sub: [Bucket(h, *(int(v or 0) for v in found[(sub, h)])) if (sub, h) in found else Bucket(h)
                  for h in hours] for sub in subscription_ids}
