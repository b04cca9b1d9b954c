"""Hourly outcomes read from rolled-up hours answer exactly what summing the minutes answers."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select

from dashboard.stats import outcomes, rollup
from dashboard.core.extensions import db
from dashboard.models import OutcomeHour


def _add(when, sub, succeeded=0, failed=0, dead=0):
    with db.engine.begin() as conn:
        outcomes.add(conn, {(sub, outcomes.minute_of(when)): [succeeded, failed, dead, 10]})


def test_rolled_up_hours_match_the_minutes_and_the_current_hour_stays_live(app, producer, receiver, clock):
    a = producer.subscribe(receiver.url + "/status/200")["id"]
    b = producer.subscribe(receiver.url + "/status/500")["id"]
    now = clock.now().replace(minute=30, second=0, microsecond=0)
    for hours_ago in range(0, 30, 3):
        _add(now - dt.timedelta(hours=hours_ago, minutes=7), a, succeeded=hours_ago + 1)
        _add(now - dt.timedelta(hours=hours_ago, minutes=50), b, failed=2, dead=1)
    since = now - dt.timedelta(hours=23)

    first = rollup.hourly(db.session, [a, b], since, now)
    assert first == outcomes.series(db.session, [a, b], since, now, 3600)
    marked = db.session.scalar(select(func.count()).where(OutcomeHour.subscription_id == rollup.DONE))
    assert marked == 23  # every hour before the current one, once
    assert rollup.roll_up(db.engine, rollup.hour_of(since), rollup.hour_of(now)) == 0

    _add(now - dt.timedelta(minutes=1), a, succeeded=5)  # the current hour keeps counting
    second = rollup.hourly(db.session, [a, b], since, now)
    assert second == outcomes.series(db.session, [a, b], since, now, 3600)
    assert second[a][-1].succeeded == 1 + 5 and sum(x.failed for x in second[b]) == 2 * 8
