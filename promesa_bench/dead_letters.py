"""`promesa bench --dashboard`, the dead-letter desk's part: its pages and the count per filter, timed on
whatever the dashboard bench seeded (any shape with dead letters over the run's subscriptions).

Two hooks for the bench's run_dashboard: `pages(run, client)` adds paths to time, `counts(run, samples)`
times the count alone per filter (it must stay under 300 ms at 100,000 dead letters).
"""

from __future__ import annotations

import datetime as dt
import re
import time

from dashboard.core.extensions import db
from dashboard.models import Delivery, Replay, Subscription
from dashboard.operations import replays
from promesa_bench.harness import percentile


def _time(call, samples: int) -> dict:
    times = []
    for _ in range(samples):
        began = time.perf_counter()
        call()
        times.append((time.perf_counter() - began) * 1000)
    return {"p50_ms": round(percentile(times, 50), 1), "p95_ms": round(percentile(times, 95), 1)}


def _window(now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """Six hours, two days back: inside the seeded history."""
    return now - dt.timedelta(days=2), now - dt.timedelta(hours=42)


def _with_dead_letters(run) -> str | None:
    """One of the run's subscriptions that has dead letters."""
    from sqlalchemy import select

    return db.session.scalar(select(Delivery.subscription_id).join(Subscription).where(
        Subscription.team_id == run.team_id, Delivery.state == "dead").limit(1))


def pages(run, client) -> dict[str, str]:
    """The dead-letter desk's pages: every kind of filter, the next page, the replay pages (one replay
    whose 10,000 replayed deliveries the progress partial counts live)."""
    from sqlalchemy import select, update

    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    since, until = (t.strftime("%Y-%m-%dT%H:%M") for t in _window(now))
    first = client.get("/dead-letters").get_data(as_text=True)
    older = re.search(r'href="(/dead-letters\?before=[^"]+)">Older', first)
    with run.app.app_context():
        subs = select(Subscription.id).where(Subscription.team_id == run.team_id)
        sub = _with_dead_letters(run)
        replay = Replay(actor_kind="system", actor="bench", team_id=run.team_id, filter={"team_id": run.team_id},
                        filter_key=f"bench-{run.run_id}", total=10_000, done=10_000, succeeded=0, failed=0,
                        state="finished", created_at=now, started_at=now, finished_at=now)
        db.session.add(replay)
        db.session.flush()
        replay_id = replay.id
        stamped = db.session.scalars(select(Delivery.id).where(Delivery.subscription_id.in_(subs)).limit(10_000)).all()
        db.session.execute(update(Delivery).where(Delivery.id.in_(stamped)).values(replay_id=replay_id)
                           .execution_options(synchronize_session=False))
        db.session.commit()
        db.session.remove()
    return {"dead_letters": "/dead-letters",
            "dead_letters_page_2": older.group(1).replace("&amp;", "&") if older else "/dead-letters",
            "dead_letters_subscription": f"/dead-letters?subscription={sub}",
            "dead_letters_window": f"/dead-letters?since={since}&until={until}",
            "dead_letters_type_result": "/dead-letters?event_type=bench.seed&result=5xx",
            "replays": "/replays", "replay_progress": f"/replays/{replay_id}"}


def counts(run, samples: int) -> dict:
    """The count alone, for the filters an operator reaches for first."""

    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    since, until = _window(now)
    out = {}
    with run.app.app_context():
        sub = _with_dead_letters(run)
        filters = {
            "all": replays.DeadLetterFilter(),
            "team": replays.DeadLetterFilter(team_id=run.team_id),
            "subscription": replays.DeadLetterFilter(subscription_id=sub),
            "window_6h": replays.DeadLetterFilter(since=since, until=until),
            "event_type": replays.DeadLetterFilter(event_types=("bench.seed",)),
            "status_class": replays.DeadLetterFilter(result="5xx"),
            "every_field": replays.DeadLetterFilter(team_id=run.team_id, event_types=("bench.seed",), result="500",
                                                    since=now - dt.timedelta(days=3)),
        }
        for name, dead in filters.items():
            where = dead.where()
            out[name] = _time(lambda: replays.count(where), samples) | {"matching": replays.count(where)}
        db.session.remove()
    return out
