"""`promesa bench --scale` and `--prune-rows`: what delivery costs as the data grows.

- subscriptions: the same events, each to one of 1, 10, 100 and 1,000 subscriptions of a team;
- settled history: throughput and the dashboard's list pages before and after many settled
  deliveries (with an attempt and an event each) are written into the tables;
- the sweeper: one pass over many due deliveries that Redis lost, then one over the same ones
  queued again (the steady state: nothing to re-enqueue, every one asked about);
- pruning: delivery while `promesa prune` deletes old rows, against delivery without it.

Seeded rows are written by the database itself (one INSERT ... SELECT FROM generate_series per
table) on PostgreSQL; elsewhere through the bench's bulk inserts. They belong to the run's teams and
are deleted with them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import time

import click

from dashboard.app import create_app
from dashboard.core.extensions import db
from dashboard.models import Delivery
from dashboard.operations.sweeper import sweep_once
from dashboard.queue.work import WorkQueue
from promesa_bench.cpu import drift, machine_speed_since
from promesa_bench.harness import (
    Run,
    _patched_environ,
    _seed,
    dashboard_pages,
    run_pipeline,
    time_pages,
)

SUBSCRIPTION_COUNTS = (1, 10, 100, 1000)
# Requests per page: p95 of 30 was the second-slowest request, and one slow request moved it by half.
PAGE_SAMPLES = 100


# -- seeding ------------------------------------------------------------------------------------
_SEED_EVENTS = """
INSERT INTO events (key, id, team_id, type, version, data, body, occurred_at, created_at)
SELECT CAST(:tag_evt AS text) || i, CAST(:tag_evt AS text) || i, :team_id, 'bench.seed', 1, CAST('{"resource_id": "r"}' AS json),
       '{"id":"' || CAST(:tag_evt AS text) || i || '","type":"bench.seed","version"\\:1,"timestamp":"2026-01-01T00:00:00.000Z",'
       || '"data":{"resource_id":"r"}}',
       CAST(:at AS timestamp) - i * interval '1 millisecond', CAST(:at AS timestamp) - i * interval '1 millisecond'
FROM generate_series(1, :n) AS i
"""
_SEED_DELIVERIES = """
INSERT INTO deliveries (id, event_key, subscription_id, state, attempt_count, retry_base, next_attempt_at,
                        last_status_code, created_at, updated_at, succeeded_at, dead_lettered_at)
SELECT CAST(:tag_dlv AS text) || i, CAST(:tag_evt AS text) || i, :subscription_id, CAST(:state AS text), :attempts, 0,
       CASE WHEN CAST(:state AS text) = 'pending' THEN CAST(:at AS timestamp) END,
       CASE WHEN CAST(:state AS text) = 'succeeded' THEN 200 WHEN :state = 'dead' THEN 500 END,
       CAST(:at AS timestamp) - i * interval '1 millisecond', CAST(:at AS timestamp),
       CASE WHEN CAST(:state AS text) = 'succeeded' THEN CAST(:at AS timestamp) - i * interval '1 millisecond' END,
       CASE WHEN CAST(:state AS text) = 'dead' THEN CAST(:at AS timestamp) - i * interval '1 millisecond' END
FROM generate_series(1, :n) AS i
"""
_SEED_ATTEMPTS = """
INSERT INTO attempts (delivery_id, number, attempted_at, duration_ms, status_code, response_excerpt)
SELECT CAST(:tag_dlv AS text) || i, 1, CAST(:at AS timestamp) - i * interval '1 millisecond', 3, 200, 'status 200'
FROM generate_series(1, :n) AS i
"""


def seed(run: Run, tag: str, subscription_id: str, count: int, age_days: float, state: str) -> float:
    """`count` deliveries of one subscription in `state`, `age_days` old (succeeded / dead: with one
    attempt; pending: due, no attempt), each with its own event, then settle the tables. Returns the seconds
    the rows took to write."""
    from sqlalchemy import text

    began = time.monotonic()
    at = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(days=age_days)
    if run.database != "postgresql":
        # (_seed gives only a scheduled delivery a due time: pending work is seeded as a due retry there.)
        kind = "scheduled" if state == "pending" else state
        _seed(run, tag, [subscription_id], count, 0 if state == "pending" else 1, lambda i: kind)
        return time.monotonic() - began
    params = {"tag_evt": f"evt_{tag}{run.run_id}_", "tag_dlv": f"dlv_{tag}{run.run_id}_", "team_id": run.team_id,
              "subscription_id": subscription_id, "state": state, "attempts": 0 if state == "pending" else 1,
              "at": at, "n": count}
    with run.app.app_context():
        with db.engine.begin() as conn:
            conn.execute(text(_SEED_EVENTS), params)
            conn.execute(text(_SEED_DELIVERIES), params)
            if state != "pending":
                conn.execute(text(_SEED_ATTEMPTS), params)
        seconds = time.monotonic() - began
        settle(db.engine)
        db.engine.dispose()
    return seconds


def settle(engine) -> None:
    """Leave the seeded tables as months of traffic would have: vacuumed (visibility map and hint bits
    set, statistics fresh) and checkpointed, so that the phase after the seed does not pay for writing
    back the load. (On a server without autovacuum, like this bench's, nothing else would.)"""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM (ANALYZE) events, deliveries, attempts")
        try:
            conn.exec_driver_sql("CHECKPOINT")
        except Exception as exc:  # noqa: BLE001 - a role without pg_checkpoint: the run goes on
            click.echo(f"could not CHECKPOINT ({type(exc).__name__}); the history phase may run during one", err=True)


def _pages_of(run: Run, subscription_id: str) -> dict[str, str]:
    """The dashboard pages of one subscription, its second page starting halfway down its deliveries."""
    from sqlalchemy import func, select

    with run.app.app_context():
        ids = select(Delivery.id).where(Delivery.subscription_id == subscription_id)
        total = db.session.scalar(select(func.count()).select_from(ids.subquery()))
        middle = db.session.scalar(ids.order_by(Delivery.id.desc()).offset(total // 2).limit(1))
        newest = db.session.scalar(ids.order_by(Delivery.id.desc()).limit(1))
        db.session.remove()
    return dashboard_pages(subscription_id, middle, newest)


def _timed_pages(run: Run, subscription_id: str) -> tuple[dict, float | None]:
    """The pages' timings, and the metronome's median while they were timed."""
    began = time.monotonic()
    pages = time_pages(run, _pages_of(run, subscription_id), PAGE_SAMPLES)
    return pages, machine_speed_since(run, began)


def _worst_p95(pages: dict) -> float:
    return max(p["p95_ms"] for p in pages.values())


# -- the sweeper --------------------------------------------------------------------------------
def sweep_passes(run: Run, due: int) -> dict:
    """One sweeper pass over `due` due deliveries that Redis does not hold (all re-enqueued), and one
    over the same deliveries now queued (nothing to do but ask). Runs against Redis keys of its own, so
    the run's workers never see this work."""

    run.make_team(1, 0)
    seeded = seed(run, "due", run.healthy_ids[0], due, 0.01, "pending")
    prefix = f"{run.prefix}-sweep"
    with _patched_environ(dict(run.env, PROMESA_REDIS_PREFIX=prefix, PROMESA_QUEUE=prefix)):
        app = create_app({"INSTANCE_PATH": str(run.tmp)})
    passes = []
    for _ in range(2):
        began = time.perf_counter()
        cpu = time.process_time()
        found = sweep_once(app)
        passes.append({"re_enqueued": found, "seconds": round(time.perf_counter() - began, 3),
                       "cpu_seconds": round(time.process_time() - cpu, 3)})
    work = WorkQueue.for_app(app)
    held = work.ready_count()
    work.rq.empty()  # the drain job nobody will run (the run's clean-up deletes the keys)
    work.conn.srem("rq:queues", work.rq.key)
    with app.app_context():
        db.engine.dispose()
    return {"due": due, "seed_seconds": round(seeded, 1), "lost_pass": passes[0], "steady_pass": passes[1],
            "ready_after": held}


# -- pruning --------------------------------------------------------------------------------------
def run_prune(run: Run, rows: int, events: int, publishers: int, timeout: float, batch: int) -> dict:
    """Delivery with and without `promesa prune` deleting `rows` old succeeded deliveries (each with
    its attempt and its event) at the same time."""
    from sqlalchemy import func, select

    subscription_id = _idle_subscription(run)  # not one the phases count: what is pruned must not be
    seeded = seed(run, "prune", subscription_id, rows, 45, "succeeded")
    cutoff = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(days=31)

    def left() -> int:
        with run.app.app_context():
            n = db.session.scalar(select(func.count()).select_from(Delivery).where(
                Delivery.subscription_id == subscription_id, Delivery.state == "succeeded",
                Delivery.succeeded_at < cutoff))
            db.session.remove()
        return n

    without = run_pipeline(run, events, publishers, None, timeout, False, batch)
    log = open(run.tmp / "prune.log", "wb")
    began = time.monotonic()
    pruner = subprocess.Popen([sys.executable, "-m", "dashboard.cli", "prune"], env=run.env, stdout=log,
                              stderr=subprocess.STDOUT)
    run.children.append(pruner)
    try:
        during = run_pipeline(run, events, publishers, None, timeout, False, batch)
        remaining = left()
        still_running = pruner.poll() is None
        with contextlib.suppress(subprocess.TimeoutExpired):  # the measurement is done: the rest is its rate
            pruner.wait(timeout)
    finally:
        if pruner.poll() is None:
            pruner.terminate()
            pruner.wait(15)
    elapsed = time.monotonic() - began
    remaining_at_end = left()
    return {"rows": rows, "seed_seconds": round(seeded, 1), "without": _phase(without), "with_prune": _phase(during),
            "ratio": round(during["deliveries_per_s"] / without["deliveries_per_s"], 3)
            if without["deliveries_per_s"] and during["deliveries_per_s"] else None,
            "pruned_during": rows - remaining, "prune_outlasted_the_run": still_running,
            "prune_seconds": round(elapsed, 1), "prune_exit": pruner.returncode, "left": remaining_at_end,
            "pruned_per_s": round((rows - remaining_at_end) / elapsed, 1)}


def _idle_subscription(run: Run) -> str:
    """A subscription of the run's team that no published event goes to."""

    with run.app.app_context():
        resp = run.app.test_client().post("/api/v1/subscriptions", headers={"Authorization": f"Bearer {run.token}"},
                                          json={"url": f"{run.receiver_url}/ok/idle", "event_types": ["bench.idle"]})
        db.session.remove()
    if resp.status_code != 201:
        raise click.ClickException(f"could not subscribe: {resp.get_json()}")
    return resp.get_json()["id"]


def _phase(result: dict) -> dict:
    keys = ("deliveries_per_s", "ingest_events_per_s", "seconds", "complete", "latency_ms")
    return {k: result[k] for k in keys}


# -- the whole --scale run ------------------------------------------------------------------------
RUNS_PER_PHASE = 5


def median_run(run: Run, events: int, publishers: int, timeout: float, batch: int,
               typed: bool = False) -> tuple[dict, list[float]]:
    """The pipeline RUNS_PER_PHASE times: the run of median throughput, and every run's deliveries/s. One run
    says little here: after the 10,000,000-row seed, three runs in a row went 174, 198, 248 deliveries/s, and
    one run each of 1, 10, 100 and 1,000 subscriptions put 10 at 0.78 of one and 1,000 at 0.885."""
    results = []
    for _ in range(RUNS_PER_PHASE):
        run.analyze("events", "deliveries", "attempts")  # as autovacuum keeps a growing table (a tenth of growth)
        results.append(run_pipeline(run, events, publishers, None, timeout, False, batch, typed=typed))
    rates = [r["deliveries_per_s"] or 0.0 for r in results]
    return sorted(results, key=lambda r: r["deliveries_per_s"] or 0.0)[len(results) // 2], rates
def run_scale(run: Run, events: int, publishers: int, timeout: float, batch: int, settled: int, due: int,
              log) -> dict:
    # The history first: later phases add a thousand subscriptions, and the overview lists every one.
    run.make_team(1, 0)
    subscription_id = run.healthy_ids[0]
    run_pipeline(run, max(50, events // 5), publishers, None, timeout, False, batch)  # warm: workers, pools, plans
    if run.database == "postgresql":
        # Statistics for tables that are no longer empty, and every plan made again with them: the web
        # processes planned their foreign-key check of events.key on the warm-up's first event, as a scan
        # (see bench.seed_history), and "empty" measured that scan over a growing table.

        with run.app.app_context():
            settle(db.engine)
            db.engine.dispose()
    empty, empty_runs = median_run(run, events, publishers, timeout, batch)
    empty_pages, empty_speed = _timed_pages(run, subscription_id)
    log(f"before the history: {empty_runs} deliveries/s, dashboard p95 <= {_worst_p95(empty_pages)} ms")
    seeded = seed(run, "settled", subscription_id, settled, 1, "succeeded")
    log(f"seeded {settled} settled deliveries in {seeded:.0f} s")
    full, full_runs = median_run(run, events, publishers, timeout, batch)
    full_pages, full_speed = _timed_pages(run, subscription_id)
    log(f"with the history: {full_runs} deliveries/s, dashboard p95 <= {_worst_p95(full_pages)} ms")
    history = {"settled": settled, "seed_seconds": round(seeded, 1), "empty": _phase(empty), "full": _phase(full),
               "empty_runs": empty_runs, "full_runs": full_runs,
               "empty_pages": empty_pages, "full_pages": full_pages,
               # the machine's speed while each set of pages was timed (see bench_cpu.Metronome)
               "pages_metronome_ms": {"empty": empty_speed, "full": full_speed},
               "pages_machine_drift": drift({"metronome_ms": empty_speed}, {"metronome_ms": full_speed}),
               "throughput_vs_empty": round(full["deliveries_per_s"] / empty["deliveries_per_s"], 3)
               if empty["deliveries_per_s"] and full["deliveries_per_s"] else None,
               "worst_p95_vs_empty": round(_worst_p95(full_pages) / _worst_p95(empty_pages), 3)}
    by_subscriptions = []
    for count in SUBSCRIPTION_COUNTS:
        run.make_team(count, 0, typed=True)
        result, rates = median_run(run, events, publishers, timeout, batch, typed=True)
        by_subscriptions.append({"subscriptions": count, **_phase(result), "runs": rates})
        log(f"{count} subscriptions: {rates} deliveries/s")
    first = by_subscriptions[0]["deliveries_per_s"]
    for row in by_subscriptions:
        row["vs_one"] = round(row["deliveries_per_s"] / first, 3) if first and row["deliveries_per_s"] else None

    sweeper = sweep_passes(run, due) if due else None
    return {"events": events, "batch": batch, "by_subscriptions": by_subscriptions, "history": history,
            "sweeper": sweeper}


def print_scale(out: dict) -> None:
    click.echo(f"each event to one of N subscriptions ({out['events']} events, batch {out['batch']}; "
               f"the run of median throughput of {RUNS_PER_PHASE} each):")
    click.echo("  subscriptions  deliveries/s  vs 1   ingest/s  p99 ms")
    for row in out["by_subscriptions"]:
        click.echo(f"  {row['subscriptions']:>13}  {row['deliveries_per_s']:>12}  {row['vs_one']:<5}  "
                   f"{row['ingest_events_per_s']:>8}  {row['latency_ms']['p99']}")
    h = out["history"]
    click.echo(f"with {h['settled']} settled deliveries in the tables (seeded in {h['seed_seconds']} s):")
    click.echo("  page / figure          before      after")
    click.echo(f"  {'deliveries/s':<20} {h['empty']['deliveries_per_s']:>8}  {h['full']['deliveries_per_s']:>9}"
               f"   ratio {h['throughput_vs_empty']} (medians of {h['empty_runs']} and {h['full_runs']})")
    for name, before in h["empty_pages"].items():
        after = h["full_pages"][name]
        click.echo(f"  {name + ' p95 ms':<20} {before['p95_ms']:>8}  {after['p95_ms']:>9}   (p50 {before['p50_ms']} and "
                   f"{after['p50_ms']}, of which the database {before['sql_p50_ms']} and {after['sql_p50_ms']}; "
                   f"{after['statements']} statements)")
    click.echo(f"  worst dashboard p95 ratio {h['worst_p95_vs_empty']}")
    speed = h["pages_metronome_ms"]
    click.echo(f"  the metronome while the pages were timed: {speed['empty']} and {speed['full']} ms "
               f"(the machine {h['pages_machine_drift']}x as slow the second time)")
    sweeper = out["sweeper"]
    if sweeper:
        for name in ("lost_pass", "steady_pass"):
            p = sweeper[name]
            click.echo(f"sweeper pass over {sweeper['due']} due deliveries ({name.replace('_', ' ')}): "
                       f"{p['seconds']} s ({p['cpu_seconds']} s CPU in the sweeper), re-enqueued {p['re_enqueued']}")


# -- the plot ----------------------------------------------------------------------------------------
def plot_svg(out: dict) -> str:
    """Deliveries/s against the number of subscriptions (log scale), and before/after the settled history,
    as plain SVG text."""
    rows = out["by_subscriptions"]
    h = out["history"]
    width, height, left, top, plot_w, plot_h = 640, 300, 60, 30, 360, 200
    top_value = max([r["deliveries_per_s"] or 0 for r in rows]
                    + [h["empty"]["deliveries_per_s"] or 0, h["full"]["deliveries_per_s"] or 0]) * 1.15 or 1

    def y(value: float) -> float:
        return top + plot_h - (value or 0) / top_value * plot_h

    def x(index: int) -> float:
        return left + 20 + index * (plot_w - 40) / max(1, len(rows) - 1)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
             f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
             f'<text x="{left}" y="16" font-size="13">deliveries/s ({out["events"]} events, batch {out["batch"]})</text>']
    for step in range(5):
        value = top_value * step / 4
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#e5e5e5"/>')
        parts.append(f'<text x="{left - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{value:.0f}</text>')
    points = " ".join(f"{x(i):.1f},{y(r['deliveries_per_s']):.1f}" for i, r in enumerate(rows))
    parts.append(f'<polyline points="{points}" fill="none" stroke="#2563eb" stroke-width="2"/>')
    for i, r in enumerate(rows):
        parts.append(f'<circle cx="{x(i):.1f}" cy="{y(r["deliveries_per_s"]):.1f}" r="3.5" fill="#2563eb"/>')
        parts.append(f'<text x="{x(i):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{r["subscriptions"]}</text>')
        parts.append(f'<text x="{x(i):.1f}" y="{y(r["deliveries_per_s"]) - 8:.1f}" text-anchor="middle">'
                     f'{r["deliveries_per_s"]:.0f}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h + 32}" text-anchor="middle">'
                 f'subscriptions (each event to one of them)</text>')
    bar_left = left + plot_w + 50
    for i, (label, value) in enumerate((("empty", h["empty"]["deliveries_per_s"]),
                                        (f"{h['settled']:,} settled", h["full"]["deliveries_per_s"]))):
        bx = bar_left + i * 80
        parts.append(f'<rect x="{bx}" y="{y(value):.1f}" width="50" height="{top + plot_h - y(value):.1f}" '
                     f'fill="{"#94a3b8" if i == 0 else "#0f766e"}"/>')
        parts.append(f'<text x="{bx + 25}" y="{y(value) - 6:.1f}" text-anchor="middle">{(value or 0):.0f}</text>')
        parts.append(f'<text x="{bx + 25}" y="{top + plot_h + 16}" text-anchor="middle">{label}</text>')
    parts.append(f'<text x="{bar_left + 65}" y="{top + plot_h + 32}" text-anchor="middle">history in the tables</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def scale_command(events, workers, web_workers, publishers, batch, settled, due, plot, slow_seconds, timeout, keep,
                  as_json, log) -> None:
    started = dt.datetime.now(dt.timezone.utc)
    with Run(workers, web_workers, slow_seconds, keep, log) as run:
        log(f"bench {run.run_id} --scale: {events} events per phase, {workers} workers, "
            f"{run.database} + {run.redis_kind}")
        result = run_scale(run, events, publishers, timeout, batch, settled, due, log)
    out = {"started_at": started.isoformat(timespec="seconds"), "database": run.database, "redis": run.redis_kind,
           "workers": workers, "web_workers": web_workers, "publishers": publishers, "cpus": os.cpu_count(),
           "load_average": [round(v, 2) for v in os.getloadavg()], **result}
    print_scale(out)
    if plot:
        with open(plot, "w") as fh:
            fh.write(plot_svg(out))
        click.echo(f"plot written to {plot}")
    complete = all(r["complete"] for r in out["by_subscriptions"]) and out["history"]["full"]["complete"]
    if as_json:
        click.echo(json.dumps(out, sort_keys=True))
    if not complete:
        click.echo("INCOMPLETE: not every delivery was recorded within the timeout", err=True)
        sys.exit(1)
