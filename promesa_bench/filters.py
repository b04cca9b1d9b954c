"""`promesa bench --filters`: what payload filters cost ingest (issue 39: at least 0.9 of ingest without them).

One team with --subscriptions endpoints (every event goes to each). With the workers stopped, rounds alternate
two phases of single-event ingest, each timed on its own: no filter on any subscription, then FILTER (five
conditions, which every bench event passes, so both phases write the same deliveries and differ only by the
filters) on every one of them, the order reversed every other round. Setting or clearing the filters is a
committed change to the subscriptions, so each phase starts by reading the routing afresh, as after any edit.
Last, a check: every event of the phases got a delivery per endpoint, and events the filter refuses (another
type) got none.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import statistics
import time

import click
from sqlalchemy import func, select, update

from dashboard.core import filters as core_filters
from dashboard.core.clock import utcnow
from dashboard.core.extensions import db
from dashboard.ingest import quotas
from dashboard.models import Delivery, Event, Subscription, TeamQuota
from promesa_bench.cpu import CpuWindow, drift, drifted
from promesa_bench.harness import Run, _publish

# Five conditions, of four operators, that every bench event (bench.ping, version 1, data.resource_id and
# data.resource_version 1) passes; another type fails the first.
FILTER = {"type": "bench.ping", "version": {"$gte": 1}, "data.resource_version": {"$in": [1, 2, 3]},
          "data.resource_id": {"$exists": True}, "data.region": {"$ne": "mars"}}
KINDS = ("no filter", "5-condition filter")
REFUSED = 50  # events of another type published at the end, with the filters on: none may get a delivery


def _set_filters(run: Run, spec: dict | None) -> None:
    with run.app.app_context():
        db.session.execute(update(Subscription).where(Subscription.team_id == run.team_id).values(filter=spec))
        db.session.commit()
        db.session.remove()


def _phase(run: Run, events: int, publishers: int, types: int = 0) -> dict:
    cpu = CpuWindow(run)
    sent, errors, first, last = asyncio.run(_publish(run.web_url + "/api/v1/events", run.token, events, publishers,
                                                     None, types=types))
    return {"accepted": len(sent), "errors": errors, "per_s": round(len(sent) / (last - first), 1),
            "cpu": cpu.close(len(sent))}


def _deliveries(run: Run, event_type: str) -> tuple[int, int]:
    """(events of the type, deliveries of them) of the run's team."""
    with run.app.app_context():
        events = db.session.scalar(select(func.count()).select_from(Event)
                                   .where(Event.team_id == run.team_id, Event.type == event_type))
        deliveries = db.session.scalar(select(func.count()).select_from(Delivery)
                                       .join(Event, Event.key == Delivery.event_key)
                                       .where(Event.team_id == run.team_id, Event.type == event_type))
        db.session.remove()
    return events, deliveries


def evaluation_us(samples: int = 100_000) -> float:
    """One test of FILTER on a bench event, in microseconds of this process (what ingest adds per event and
    filtered subscription, the routing read aside)."""
    admits = core_filters.compile(FILTER)
    body = {"id": "evt_1", "type": "bench.ping", "version": 1, "timestamp": "2026-12-06T00:00:00.000Z",
            "data": {"resource_id": "r_1", "resource_version": 1}}
    started = time.perf_counter()
    for _ in range(samples):
        admits(body)
    return round((time.perf_counter() - started) * 1e6 / samples, 3)


def filters_command(events: int, rounds: int, healthy: int, workers: int, web_workers: int, publishers: int,
                    slow_seconds: float, keep: bool, as_json: bool, log) -> None:
    started = dt.datetime.now(dt.timezone.utc)
    with Run(workers, web_workers, slow_seconds, keep, log) as run:
        run.make_team(healthy, 0)
        with run.app.app_context():  # the workers are stopped: every delivery stays owed until the run ends
            db.session.merge(TeamQuota(team_id=run.team_id, name="queued_deliveries", value=1_000_000_000,
                                       updated_at=utcnow(), updated_by="bench"))
            db.session.commit()
            quotas.publish_limits([run.team_id])  # where ingest reads it, now rather than at the next sweep
            db.session.remove()
        log(f"bench {run.run_id}: payload filters, {healthy} endpoints, {rounds} rounds of {events} single events "
            f"per kind; {run.database} + {run.redis_kind}")
        rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
        web_ms: dict[str, list[float]] = {kind: [] for kind in KINDS}  # the web processes' CPU per event
        speeds: list[float | None] = []  # each round's filtered phase's machine speed over its neighbour's
        errors = 0
        for r in range(rounds):
            # Alternated, so that a machine slowing down or speeding up falls on both kinds alike.
            order = KINDS if r % 2 == 0 else tuple(reversed(KINDS))
            phases = {}
            for kind in order:
                _set_filters(run, FILTER if kind != KINDS[0] else None)
                phases[kind] = _phase(run, events, publishers)
                rates[kind].append(phases[kind]["per_s"])
                web_ms[kind].append(phases[kind]["cpu"]["ms_per_unit_by_process"].get("web"))
                errors += phases[kind]["errors"]
                log(f"  round {r + 1} {kind:20s} {phases[kind]['per_s']} events/s ({phases[kind]['errors']} errors)")
            speeds.append(drift(phases[KINDS[0]]["cpu"], phases[KINDS[1]]["cpu"]))
        _set_filters(run, FILTER)
        refused = _phase(run, REFUSED, min(publishers, REFUSED), types=1)  # bench.s0: the filter's type is bench.ping
        admitted_events, admitted_deliveries = _deliveries(run, "bench.ping")
        refused_events, refused_deliveries = _deliveries(run, "bench.s0")
    ratios = [round(f / n, 3) for f, n in zip(rates[KINDS[1]], rates[KINDS[0]]) if n]
    out = {
        "started_at": started.isoformat(timespec="seconds"), "database": run.database, "redis": run.redis_kind,
        "subscriptions": healthy, "events_per_phase": events, "rounds": rounds, "publishers": publishers,
        "web_workers": web_workers, "filter": FILTER, "publish_errors": errors + refused["errors"], "rates": rates,
        "medians": {kind: round(statistics.median(values), 1) for kind, values in rates.items()},
        "web_ms_per_event": web_ms,
        "web_ms_per_event_medians": {kind: statistics.median(v) if None not in v else None
                                     for kind, v in web_ms.items()},
        "filter_test_us": evaluation_us(),
        "round_ratios": ratios, "ratio": round(statistics.median(ratios), 3) if ratios else None, "machine_drift": speeds,
        "admitted": {"events": admitted_events, "deliveries": admitted_deliveries,
                     "expected_deliveries": admitted_events * healthy},
        "refused": {"events": refused_events, "deliveries": refused_deliveries},
    }
    out["complete"] = admitted_deliveries == admitted_events * healthy and refused_deliveries == 0 \
        and refused_events == REFUSED and not out["publish_errors"]
    click.echo(f"payload filters, {healthy} endpoints, {rounds} rounds of {events} single events per kind "
               f"(median events/s):")
    for kind in KINDS:
        click.echo(f"  {kind:20s} {out['medians'][kind]:>9}   rounds: {', '.join(str(v) for v in rates[kind])}")
    click.echo("the web processes' CPU per event, median ms: " + ", ".join(
        f"{kind} {out['web_ms_per_event_medians'][kind]}" for kind in KINDS))
    click.echo(f"filtered / unfiltered, median of the rounds' ratios: {out['ratio']} ({', '.join(map(str, ratios))})")
    click.echo(f"one test of the filter on an event: {out['filter_test_us']} us (x {healthy} endpoints per event)")
    click.echo(f"deliveries: {admitted_deliveries} for {admitted_events} events x {healthy} endpoints; "
               f"{refused_deliveries} for {refused_events} events the filter refuses")
    for r, speed in enumerate(speeds):
        if drifted(speed):
            click.echo(f"NOTE: round {r + 1}: the machine ran {abs(speed - 1):.0%} "
                       f"{'slower' if speed > 1 else 'faster'} in its filtered phase than in its unfiltered one (the "
                       "metronome): that round's ratio says more about the machine than about Promesa", err=True)
    if as_json:
        click.echo(json.dumps(out, sort_keys=True))
    if not out["complete"]:
        click.echo("INCOMPLETE: a delivery is missing, the filter let an event through, or a publish failed", err=True)
        raise SystemExit(1)
