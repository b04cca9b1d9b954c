"""Attempt latency per time bucket for one subscription: the median and the 95th percentile.

outcome_counts keeps only summed durations (an average), and a slow receiver hides in an average, so
this reads the attempts themselves: those of the subscription's deliveries created within the window
(and its max age before it, the longest a retry schedule runs), at most MAX_ATTEMPTS of the newest.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import select

from dashboard.core.clock import unix
from dashboard.models import Attempt, Delivery

MAX_ATTEMPTS = 50_000  # the newest this many attempts in the window: a bound on what one page reads


@dataclass(slots=True)
class LatencyBucket:
    start: dt.datetime
    count: int = 0
    p50: int | None = None
    p95: int | None = None


def percentile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile of an ascending, non-empty list."""
    rank = max(1, -(-len(sorted_values) * q // 1))  # ceil(n * q), at least the first
    return sorted_values[int(rank) - 1]


def per_bucket(session, subscription_id: str, starts: list[dt.datetime], bucket_seconds: int,
               until: dt.datetime, max_age_seconds: int) -> tuple[list[LatencyBucket], bool]:
    """One LatencyBucket per start (bucket starts as the counts chart has them); and whether the
    attempts were cut at MAX_ATTEMPTS (the oldest buckets then show fewer than there were)."""
    if not starts:
        return [], False
    since = starts[0]
    rows = session.execute(
        select(Attempt.attempted_at, Attempt.duration_ms)
        .join(Delivery, Delivery.id == Attempt.delivery_id)
        .where(Delivery.subscription_id == subscription_id,
               Delivery.created_at >= since - dt.timedelta(seconds=max_age_seconds),
               Attempt.attempted_at >= since, Attempt.attempted_at < until)
        .order_by(Attempt.attempted_at.desc()).limit(MAX_ATTEMPTS + 1)).all()
    cut = len(rows) > MAX_ATTEMPTS
    first = unix(since)
    found: list[list[int]] = [[] for _ in starts]
    for at, ms in rows[:MAX_ATTEMPTS]:
        i = int((unix(at) - first) // bucket_seconds)
        if 0 <= i < len(starts):
            found[i].append(ms)
    out = []
    for start, values in zip(starts, found):
        values.sort()
        out.append(LatencyBucket(start, len(values), percentile(values, 0.5) if values else None,
                                 percentile(values, 0.95) if values else None))
    return out, cut
