"""Outcomes over time: attempts per subscription per minute (the `outcome_counts` table).

The delivery engine adds to it as it records attempts (`add`), in the same transaction, so the
counts are exactly as durable as the attempts. Charts, health figures on the overview, the
incident rules and /metrics read it (`series`, `totals`) instead of scanning attempts, which
grow without bound: a week of one subscription is at most 10,080 small rows.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite

from dashboard.core.clock import from_unix, unix
from dashboard.models import OutcomeCount

OUTCOME_COUNTS = OutcomeCount.__table__
_COUNTERS = ("succeeded", "failed", "dead", "duration_ms")


def minute_of(when: dt.datetime) -> dt.datetime:
    return when.replace(second=0, microsecond=0)


def add(conn, counts: dict[tuple[str, dt.datetime], list[int]]) -> None:
    """Add {(subscription id, minute): [succeeded, failed, dead, duration_ms]} to the table, upserting.
    Keys go in sorted order: two workers upserting the same rows then lock them in the same order."""
    if not counts:
        return
    rows = [{"subscription_id": sub, "minute": minute, **dict(zip(_COUNTERS, values))}
            for (sub, minute), values in sorted(counts.items())]
    conn.execute(_upsert(conn.dialect.name), rows)


@functools.cache
def _upsert(dialect_name: str):
    """Built once per dialect: the worker adds on every record, and building the statement (and its
    cache key) anew each time would be a noticeable share of a delivering worker's CPU."""
    insert = (postgresql.insert if dialect_name == "postgresql" else sqlite.insert)(OUTCOME_COUNTS)
    return insert.on_conflict_do_update(
        index_elements=[OUTCOME_COUNTS.c.subscription_id, OUTCOME_COUNTS.c.minute],
        set_={name: OUTCOME_COUNTS.c[name] + insert.excluded[name] for name in _COUNTERS})


@dataclass(slots=True)
class Bucket:
    start: dt.datetime
    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    duration_ms: int = 0

    @property
    def attempts(self) -> int:
        return self.succeeded + self.failed

    @property
    def success_rate(self) -> float | None:
        return self.succeeded / self.attempts if self.attempts else None


def _bucket_expr(session, bucket_seconds: int):
    """The start of each row's bucket, as unix seconds, computed by the database."""
    if session.get_bind().dialect.name == "postgresql":
        epoch = func.extract("epoch", OUTCOME_COUNTS.c.minute)
    else:
        epoch = func.strftime("%s", OUTCOME_COUNTS.c.minute)
    return func.floor(epoch / bucket_seconds) * bucket_seconds


def series(session, subscription_ids: list[str], since: dt.datetime, until: dt.datetime,
           bucket_seconds: int = 3600) -> dict[str, list[Bucket]]:
    """Per subscription, one bucket every `bucket_seconds` from `since` to `until`, empty ones included."""
    if not subscription_ids:
        return {}
    start = from_unix(unix(since) // bucket_seconds * bucket_seconds)
    bucket = _bucket_expr(session, bucket_seconds).label("bucket")
    rows = session.execute(
        select(OUTCOME_COUNTS.c.subscription_id, bucket, *(func.sum(OUTCOME_COUNTS.c[name]) for name in _COUNTERS))
        .where(OUTCOME_COUNTS.c.subscription_id.in_(subscription_ids), OUTCOME_COUNTS.c.minute >= start,
               OUTCOME_COUNTS.c.minute < until)
        .group_by(OUTCOME_COUNTS.c.subscription_id, bucket)).all()
    found = defaultdict(dict)
    for sub, at, *values in rows:
        found[sub][int(at)] = values
    out = {}
    count = max(1, math.ceil((unix(until) - unix(start)) / bucket_seconds))
    for sub in subscription_ids:
        buckets = []
        for i in range(count):
            at = int(unix(start)) + i * bucket_seconds
            values = found[sub].get(at)
            buckets.append(Bucket(from_unix(at), *(int(v or 0) for v in values)) if values else Bucket(from_unix(at)))
        out[sub] = buckets
    return out


def totals(session, subscription_ids: list[str], since: dt.datetime,
           until: dt.datetime | None = None) -> dict[str, Bucket]:
    """Per subscription, the sums since a time (a window's figures: success rate, dead letters)."""
    if not subscription_ids:
        return {}
    query = (select(OUTCOME_COUNTS.c.subscription_id, *(func.sum(OUTCOME_COUNTS.c[name]) for name in _COUNTERS))
             .where(OUTCOME_COUNTS.c.subscription_id.in_(subscription_ids), OUTCOME_COUNTS.c.minute >= minute_of(since))
             .group_by(OUTCOME_COUNTS.c.subscription_id))
    if until is not None:
        query = query.where(OUTCOME_COUNTS.c.minute < until)
    found = {sub: Bucket(since, *(int(v or 0) for v in values)) for sub, *values in session.execute(query)}
    return {sub: found.get(sub, Bucket(since)) for sub in subscription_ids}

