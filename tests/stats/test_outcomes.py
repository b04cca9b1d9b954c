"""Outcome counts per subscription per minute: written with the attempts, read by charts and alerts."""

from __future__ import annotations

import datetime as dt

from dashboard.stats import outcomes
from dashboard.core.extensions import db

from tests.support.pipeline import deliver_due


def test_attempts_are_counted_per_subscription_and_minute(app, producer, receiver, clock):
    ok = producer.subscribe(receiver.url + "/ok", event_types=["file.updated"])
    broken = producer.subscribe(receiver.url + "/status/400", event_types=["file.deleted"])
    start = clock.now()
    for _ in range(3):
        producer.publish("file.updated")
    producer.publish("file.deleted")
    deliver_due(app, clock)
    for _ in range(2):  # the 4xx rule gives up after the third attempt
        clock.advance(minutes=10)
        deliver_due(app, clock)

    until = clock.now() + dt.timedelta(minutes=1)
    totals = outcomes.totals(db.session, [ok["id"], broken["id"]], start)
    assert (totals[ok["id"]].succeeded, totals[ok["id"]].failed, totals[ok["id"]].dead) == (3, 0, 0)
    assert (totals[broken["id"]].succeeded, totals[broken["id"]].failed, totals[broken["id"]].dead) == (0, 3, 1)
    assert totals[ok["id"]].success_rate == 1.0 and totals[broken["id"]].success_rate == 0.0

    per_10_min = outcomes.series(db.session, [broken["id"]], start, until, bucket_seconds=600)[broken["id"]]
    assert sum(b.failed for b in per_10_min) == 3
    assert all(b.failed <= 1 for b in per_10_min)  # one attempt in each of three different windows
    assert len(per_10_min) >= 3 and per_10_min[0].start <= start < per_10_min[0].start + dt.timedelta(minutes=10)
