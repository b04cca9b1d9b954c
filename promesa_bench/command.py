"""`promesa bench`: the command, and the phases it runs from the bench's other modules."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import sys

import click

from dashboard.core.extensions import db
from promesa_bench import pages as bench_pages
from promesa_bench.baseline import baseline_table
from promesa_bench.consumers import consumers_command
from promesa_bench.cpu import CpuWindow, drift, drifted
from promesa_bench.drain_cpu import drain_cpu_command
from promesa_bench.filters import filters_command
from promesa_bench.harness import (
    BUSY_ENOUGH,
    HISTORY_DEFAULT,
    SLOW_DEFAULT_SECONDS,
    Run,
    _by_process,
    _publish,
    _stop_process,
    run_pipeline,
    run_raw,
    run_replay,
    throttled_result,
    underused_phases,
)
from promesa_bench.long_poll import long_poll_command
from promesa_bench.pull import pull_command
from promesa_bench.scale import run_prune, scale_command, seed
from promesa_bench.soak import plot_svg as soak_svg
from promesa_bench.soak import run_soak


def run_ingest_baseline(run: Run, events: int, publishers: int) -> dict:
    """The least a Flask view can do per event (promesa_bench.baseline), served the same way as the
    API (gunicorn, the same settings and processes), against the same database, under the same publisher."""
    import sqlalchemy as sa

    name = f"bench_ingest_baseline_{run.run_id}"
    with run.app.app_context():
        table = baseline_table(name)
        table.create(db.engine)
    proc, url = run.start_web("baseline", "promesa_bench.baseline:create_app()",
                              dict(run.env, PROMESA_BENCH_BASELINE_TABLE=name), "/ready",
                              config="python:promesa_bench.gunicorn_baseline")
    try:
        cpu = CpuWindow(run, web=proc)
        sent, errors, first, last = asyncio.run(_publish(url + "/api/v1/events", "-", events, publishers, None))
        cpu = cpu.close(len(sent))
    finally:
        _stop_process(proc)
        with run.app.app_context():
            with db.engine.begin() as conn:
                stored = conn.execute(sa.select(sa.func.count()).select_from(table)).scalar()
            table.drop(db.engine)
    return {"events": events, "accepted": len(sent), "errors": errors, "stored": stored,
            "seconds": round(last - first, 3), "per_s": round(len(sent) / (last - first), 1) if last > first else None,
            "cpu": cpu}


def seed_history(run: Run, settled: int) -> dict:
    """A team of its own with `settled` succeeded deliveries a day old, written (and the tables settled) before
    anything is measured: the run starts on tables the size of a service that has been running.

    On tables a run had emptied (PostgreSQL then knows them, VACUUMed, to be empty), each web process planned
    its foreign-key check of events.key on its first event, as a scan of the whole table, and kept that plan
    as the table grew to thousands of rows: ingest alone then measured 0.45 - 0.63 of the bare view, against
    0.82 on tables never vacuumed. A production table is never empty, and ANALYZE replans it within a minute."""

    run.make_team(1, 0)
    seconds = seed(run, "history", run.healthy_ids[0], settled, 1.0, "succeeded")
    run.log(f"history: {settled} settled deliveries of another team, written in {seconds:.1f} s")
    return {"settled": settled, "seed_seconds": round(seconds, 1)}


def run_dashboard(run: Run, attempts: int, samples: int, consumers: int) -> dict:
    """Seed a dashboard's history and time its pages: promesa_bench.pages."""

    return bench_pages.run_dashboard(run, attempts, samples, consumers)


def _parse_receivers(spec: str | None) -> int:
    if not spec:
        return 0
    kind, _, count = spec.partition(":")
    if kind != "slow" or not count.isdigit():
        raise click.BadParameter("use slow:K, e.g. slow:1", param_hint="--receivers")
    return int(count)


def _stop_children_on_sigterm() -> None:
    """A bench ended by SIGTERM (`kill`, a timeout) tears its run down as Ctrl-C does. Python's default for
    SIGTERM ends the process without cleanup: its gunicorn, workers and receiver ran on, and took CPU from
    whatever was measured next."""
    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


@click.command("bench")
@click.option("--events", "events", default=2000, show_default=True, help="events to publish")
@click.option("--workers", "workers", default=2, show_default=True, help="`promesa worker` processes")
@click.option("--receivers", "receivers", default=None, help="extra endpoints: slow:K answers after 10 s")
@click.option("--subscriptions", "healthy", default=1, show_default=True,
              help="healthy endpoints; every event goes to each of them")
@click.option("--rate", type=float, default=None, help="publish at this steady rate (events/s)")
@click.option("--publishers", default=16, show_default=True, help="concurrent publishing connections")
@click.option("--batch", default=1, show_default=True,
              help="events per ingest request (above 1: POST /api/v1/events/batch)")
@click.option("--web-workers", default=2, show_default=True, help="gunicorn processes serving the ingest API")
@click.option("--preload", is_flag=True,
              help="publish everything before starting the workers, and time delivery alone "
                   "(latency then includes the wait)")
@click.option("--replay", "replay", default=0, show_default=True,
              help="also dead-letter this many deliveries of one subscription and time replay-all")
@click.option("--dashboard", "dashboard", is_flag=True,
              help="also seed --dashboard-attempts attempt rows and time the dashboard's list pages")
@click.option("--dashboard-attempts", default=1_000_000, show_default=True)
@click.option("--dashboard-consumers", default=bench_pages.CONSUMERS, show_default=True,
              help="with --dashboard: a team of this many consumers (one endpoint each) for the consumers pages")
@click.option("--no-raw", is_flag=True, help="skip the raw baseline")
@click.option("--rate-limit", "rate_limit", type=float, default=None,
              help="one more endpoint, as fast as the healthy ones, with this rate limit (deliveries/s): "
                   "shows its busiest second; compare the healthy figures with a run without it")
@click.option("--no-ingest-baseline", is_flag=True,
              help="skip the ingest baseline (a bare Flask view inserting one row, served the same way)")
@click.option("--ingest-alone", is_flag=True,
              help="first publish the same events with the workers stopped (ingest alone), then end to end")
@click.option("--prune-rows", default=0, show_default=True,
              help="also seed this many prunable settled deliveries and time delivery during a prune vs without")
@click.option("--scale", is_flag=True,
              help="instead: throughput at 1, 10, 100, 1000 subscriptions and with --scale-settled settled "
                   "deliveries in the tables, the dashboard's p95, and one sweeper pass at --scale-due due ids")
@click.option("--scale-settled", default=1_000_000, show_default=True)
@click.option("--scale-due", default=100_000, show_default=True)
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="with --scale: write an SVG plot here")
@click.option("--slow-seconds", default=SLOW_DEFAULT_SECONDS, show_default=True,
              help="how long a slow endpoint takes to answer")
@click.option("--timeout", "timeout", default=300.0, show_default=True,
              help="give up waiting for deliveries after this many seconds")
@click.option("--history", default=HISTORY_DEFAULT, show_default=True,
              help="settled deliveries (another team's) written before anything is measured, so that the run "
                   "starts on tables the size of a service that has been running; 0 for empty tables")
@click.option("--soak", "soak", type=click.IntRange(min=1), default=None, metavar="MINUTES",
              help="instead: publish at --rate (default 100/s) for MINUTES, sampling every process's memory, p99 and "
                   "throughput each minute, with `promesa prune` running from a third of the way in")
@click.option("--soak-prune-rows", default=100_000, show_default=True,
              help="with --soak: old settled deliveries seeded for the prune")
@click.option("--soak-minute-seconds", default=60.0, hidden=True)  # the tests' short "minutes"
@click.option("--access-log", is_flag=True,
              help="serve with gunicorn's access log on, as `promesa web` does by default (off: what it costs)")
@click.option("--consumers", "consumers", type=click.IntRange(min=1), default=None, metavar="N",
              help="addressed delivery: N consumers with an endpoint each; addressed against unaddressed ingest, "
                   "single and batch (--batch, default 100), --rounds alternated, then every delivery checked")
@click.option("--filters", "with_filters", is_flag=True,
              help="payload filters: single-event ingest with a 5-condition filter on every subscription "
                   "(--subscriptions, default 1) against none, --rounds alternated, workers stopped; then every "
                   "delivery counted")
@click.option("--pull", "with_pull", is_flag=True,
              help="pull delivery: a pull subscription's client (--pullers loops, 100 at a time, acking each 200) "
                   "against the push path to the receiver, --events deliveries each per round, --rounds alternated; "
                   "then every delivery counted")
@click.option("--long-poll", "long_poll", type=click.IntRange(min=1), default=None, metavar="N",
              help="instead: N pulls long-polling one web process (a subscription each), its threads, memory and an "
                   "API read meanwhile, then min(--events, N) events one at a time: 202 to the waiting pull's answer")
@click.option("--drain-cpu", "drain_cpu", is_flag=True,
              help="instead: one drain in this process, --rounds rounds of --events events to one endpoint, and its "
                   "own CPU per delivery (the engine's Python, apart from the machine's other work)")
@click.option("--pullers", default=2, show_default=True, help="with --pull: concurrent pull-and-ack loops")
@click.option("--rounds", default=3, show_default=True,
              help="with --consumers, --filters, --pull or --drain-cpu: rounds of each kind")
@click.option("--keep", is_flag=True, help="keep the temporary folder and the run's database rows")
@click.option("--json", "as_json", is_flag=True, help="also print the result as one JSON object on the last line")
def bench_command(events, workers, receivers, healthy, rate, publishers, batch, web_workers, preload, replay, dashboard,
                  dashboard_attempts, dashboard_consumers, no_raw, rate_limit, no_ingest_baseline, ingest_alone, prune_rows, scale,
                  scale_settled, scale_due, plot, slow_seconds, timeout, history, soak, soak_prune_rows, soak_minute_seconds, access_log,
                  consumers, with_filters, with_pull, long_poll, drain_cpu, pullers, rounds, keep, as_json):
    """Deliveries/s, publish->receive latency and a raw HTTP baseline, measured in one run."""
    slow = _parse_receivers(receivers)
    if events < 1 or workers < 1 or healthy < 1 or publishers < 1 or pullers < 1 or not 1 <= batch <= 500 \
            or history < 0:
        raise click.BadParameter("--events, --workers, --subscriptions, --publishers and --pullers must be at least 1, "
                                 "--batch from 1 to 500, --history at least 0")

    def log(message):
        click.echo(message, err=True)

    _stop_children_on_sigterm()
    if scale:
        return scale_command(events, workers, web_workers, publishers, batch, scale_settled, scale_due, plot,
                             slow_seconds, timeout, keep, as_json, log)
    if with_filters:
        return filters_command(events, rounds, healthy, workers, web_workers, publishers, slow_seconds, keep, as_json,
                               log)
    if drain_cpu:
        return drain_cpu_command(events, rounds, publishers, slow_seconds, timeout, keep, as_json, log)
    if long_poll:
        return long_poll_command(long_poll, events, timeout, keep, as_json, log)
    if with_pull:
        return pull_command(events, rounds, pullers, workers, web_workers, publishers, slow_seconds, timeout, keep,
                            as_json, log)
    if consumers:
        return consumers_command(consumers, events, batch, rounds, workers, web_workers, publishers, slow_seconds,
                                 timeout, keep, as_json, log)
    if soak:
        return soak_command(soak, rate or 100.0, workers, web_workers, publishers, soak_prune_rows, plot,
                            slow_seconds, timeout, history, keep, as_json, log, soak_minute_seconds)
    started = dt.datetime.now(dt.timezone.utc)
    with Run(workers, web_workers, slow_seconds, keep, log, access_log=access_log) as run:
        history_seeded = seed_history(run, history) if history else None
        run.make_team(healthy, slow, rate_limit)
        log(f"bench {run.run_id}: {events} events x {healthy} healthy + {slow} slow endpoints"
            f"{f' + 1 limited to {rate_limit:g}/s' if rate_limit else ''}, "
            f"{workers} workers, {run.database} + {run.redis_kind}")
        baseline = run_ingest_baseline(run, events, publishers) if batch == 1 and not no_ingest_baseline else None
        alone = run_pipeline(run, events, publishers, None, timeout, True, batch) if ingest_alone else None
        result = run_pipeline(run, events, publishers, rate, timeout, preload and not alone, batch)
        counts = run.receiver_counts()
        result["slow_requests"] = counts["slow"]
        result["throttled"] = throttled_result(run, rate_limit) if rate_limit else None
        raw = None if no_raw else run_raw(run)
        replayed = run_replay(run, replay, timeout) if replay else None
        dashboard_result = run_dashboard(run, dashboard_attempts, 30, dashboard_consumers) if dashboard else None
        if prune_rows:
            pruning = run_prune(run, prune_rows, events, publishers, timeout, batch)
        else:
            pruning = None
        config = run.app.config
    ingest = (alone or result)["ingest_events_per_s"]
    ingest_cpu = (alone or result)["cpu"].get("ingest", (alone or result)["cpu"])  # a --preload phase has two windows
    out = {
        "started_at": started.isoformat(timespec="seconds"), "database": run.database, "redis": run.redis_kind,
        "workers": workers, "web_workers": web_workers, "publishers": publishers, "rate": rate, "batch": batch,
        "healthy_endpoints": healthy, "slow_endpoints": slow, "preload": preload, "cpus": os.cpu_count(),
        "max_in_flight": config["PROMESA_MAX_IN_FLIGHT"], "drainers": config["PROMESA_DRAINERS"],
        **result,
        "history": history_seeded, "raw": raw, "replay": replayed, "dashboard": dashboard_result, "prune": pruning,
        "ingest_baseline": baseline, "ingest_baseline_per_s": baseline and baseline["per_s"],
        # Promesa's ingest (alone when measured alone) over the bare view's, same run, same publisher.
        "ingest_ratio": round(ingest / baseline["per_s"], 3) if baseline and baseline["per_s"] and ingest else None,
        "ingest_alone": alone,
        "underused_phases": underused_phases({"ingest baseline": baseline and baseline["cpu"],
                                               "ingest alone": alone and alone["cpu"]["ingest"]}),
        "end_to_end_over_ingest_alone": round(result["deliveries_per_s"] / alone["ingest_events_per_s"], 3)
        if alone and alone["ingest_events_per_s"] and result["deliveries_per_s"] else None,
        # Each ratio's second phase's machine speed over its first's (the metronome's cost; 1.0: the same).
        "machine_drift": {
            "ingest_ratio": drift(baseline and baseline["cpu"], ingest_cpu),
            "end_to_end_over_ingest_alone": drift(alone and alone["cpu"]["ingest"], alone and result["cpu"]),
            "ratio": drift(result["cpu"].get("delivery", result["cpu"]), raw),  # the pipeline's phase, then the raw loop
        },
        "ratio": round(result["deliveries_per_s"] / raw["per_s"], 3)
        if raw and raw["per_s"] and result["deliveries_per_s"] else None,
    }
    lat = out["latency_ms"]
    click.echo(f"pipeline: {out['deliveries_recorded']}/{out['deliveries_expected']} deliveries in "
               f"{out['seconds']} s = {out['deliveries_per_s']} deliveries/s "
               f"(ingest {out['ingest_events_per_s']} events/s over {out['publish_seconds']} s)")
    click.echo(f"latency publish->receive: p50 {lat['p50']} ms  p95 {lat['p95']} ms  p99 {lat['p99']} ms  "
               f"max {lat['max']} ms")
    if alone:
        click.echo(f"ingest alone (workers stopped): {alone['ingest_events_per_s']} events/s; then delivery alone "
                   f"{alone['deliveries_per_s']} deliveries/s")
    if baseline:
        click.echo(f"ingest baseline (bare Flask view, one INSERT): {baseline['per_s']} requests/s; Promesa's "
                   f"{'ingest alone' if alone or preload else 'ingest'} {ingest} events/s = "
                   f"ratio {out['ingest_ratio']}")
        click.echo(f"  the baseline's CPU of the whole machine: {baseline['cpu']['ms_per_unit']} ms per request "
                   f"({baseline['cpu']['busy_share']:.0%} busy); by process: {_by_process(baseline['cpu'])}")
    if alone:
        click.echo(f"end to end / ingest alone: {out['end_to_end_over_ingest_alone']}")
        delivery_cpu, both_cpu = alone["cpu"]["delivery"], result["cpu"]
        click.echo(f"CPU of the whole machine, ms: ingest alone {ingest_cpu['ms_per_unit']} per event "
                   f"({ingest_cpu['busy_share']:.0%} busy), delivery alone {delivery_cpu['ms_per_unit']} per delivery "
                   f"({delivery_cpu['busy_share']:.0%} busy), end to end {both_cpu['ms_per_unit']} per delivery "
                   f"({both_cpu['busy_share']:.0%} busy)")
        for name, phase in (("ingest alone", ingest_cpu), ("delivery alone", delivery_cpu), ("end to end", both_cpu)):
            click.echo(f"  {name}, by process: {_by_process(phase)}")
        phases = (("ingest baseline", baseline and baseline["cpu"]), ("ingest alone", ingest_cpu),
                  ("end to end", both_cpu))
        click.echo("the metronome's CPU for the same loop, ms (the machine's speed; lower is faster): "
                   + ", ".join(f"{name} {phase['metronome_ms']}" for name, phase in phases if phase))
    if slow:
        click.echo(f"slow endpoints: {slow}, requests they received: {out['slow_requests']}")
    if out["throttled"]:
        t = out["throttled"]
        click.echo(f"rate-limited endpoint ({t['rate_limit']:g}/s): {t['received']} received, busiest second "
                   f"{t['busiest_second']} ({t['busiest_vs_limit']:+.1%} of the limit; {t['busiest_second_sent']} by the "
                   f"workers' send times), mean {t['mean_per_s']}/s")
    if raw:
        click.echo(f"raw baseline: {raw['requests']} POSTs in {raw['seconds']} s = {raw['per_s']} requests/s "
                   f"({raw['processes']} x {raw['in_flight_per_process']} in flight)")
        click.echo(f"ratio pipeline/raw: {out['ratio']}")
    if replayed:
        click.echo(f"replay-all of {replayed['dead_letters']} dead letters: answered (and enqueued) in "
                   f"{replayed['answer_ms']} ms, {replayed['delivered']} delivered in {replayed['seconds']} s = "
                   f"{replayed['deliveries_per_s']} deliveries/s")
    if dashboard_result:
        click.echo(f"dashboard with {dashboard_result['attempts']} attempts, {dashboard_result['dead_letters']} dead "
                   f"letters over {dashboard_result['subscriptions']} subscriptions (a week of hours rolled up in "
                   f"{dashboard_result['roll_up_week_seconds']} s; seeded in "
                   f"{dashboard_result['seed_seconds']} s), {dashboard_result['samples']} requests per page:")
        for name, t in dashboard_result["pages"].items():
            click.echo(f"  {name:26s} p50 {t['p50_ms']} ms  p95 {t['p95_ms']} ms")
        click.echo("dead-letter count for a filter:")
        for name, t in dashboard_result["dead_letter_counts"].items():
            click.echo(f"  {name:26s} p50 {t['p50_ms']} ms  p95 {t['p95_ms']} ms  ({t['matching']} matching)")
        consumers = dashboard_result["consumers"]
        click.echo(f"consumers pages, a team of {consumers['consumers']} consumers (one endpoint each; seeded in "
                   f"{consumers['seed_seconds']} s), the timed one with {consumers['timed_dead_letters']} dead letters:")
        for name, t in consumers["pages"].items():
            click.echo(f"  {name:26s} p50 {t['p50_ms']} ms  p95 {t['p95_ms']} ms")
    if pruning:
        click.echo(f"delivery during a prune of {pruning['rows']} deliveries: {pruning['with_prune']['deliveries_per_s']}"
                   f" deliveries/s against {pruning['without']['deliveries_per_s']} without, ratio {pruning['ratio']} "
                   f"({pruning['pruned_during']} pruned meanwhile; {pruning['pruned_per_s']} pruned/s over "
                   f"{pruning['prune_seconds']} s, {pruning['left']} left when it was "
                   f"{'stopped' if pruning['left'] else 'done'})")
    for ratio, speed in out["machine_drift"].items():
        if drifted(speed):
            click.echo(f"NOTE: the machine ran {abs(speed - 1):.0%} {'slower' if speed > 1 else 'faster'} in the second "
                       f"phase of {ratio} than in its first (the metronome's CPU for the same loop): that ratio "
                       "says more about the machine than about Promesa: run again", err=True)
    for phase in out["underused_phases"]:
        click.echo(f"NOTE: the cores were idle for more than {1 - BUSY_ENOUGH:.0%} of {phase}: it ran below the "
                   "machine's speed (its keep-alive connections most likely went unevenly to the web processes); "
                   "its ratios are not comparable: run again", err=True)
    if not out["complete"]:
        click.echo("INCOMPLETE: not every delivery was recorded within the timeout", err=True)
    if as_json:
        click.echo(json.dumps(out, sort_keys=True))
    if not out["complete"]:
        sys.exit(1)


def soak_command(minutes, rate, workers, web_workers, publishers, prune_rows, plot, slow_seconds, timeout, history,
                 keep, as_json, log, minute_seconds=60.0):
    started = dt.datetime.now(dt.timezone.utc)
    with Run(workers, web_workers, slow_seconds, keep, log) as run:
        if history:
            seed_history(run, history)
        run.make_team(1, 0)
        log(f"soak {run.run_id}: {minutes} min at {rate:g} events/s, {workers} workers, "
            f"{run.database} + {run.redis_kind}")
        result = run_soak(run, minutes, rate, publishers, prune_rows, timeout, log, minute_seconds)
    out = {"started_at": started.isoformat(timespec="seconds"), "database": run.database, "redis": run.redis_kind,
           "workers": workers, "web_workers": web_workers, "cpus": os.cpu_count(), "soak": result}
    if plot:
        with open(plot, "w") as f:
            f.write(soak_svg(result))
    flat = result["flat"]
    click.echo(f"soak: {minutes} min at {rate:g}/s; last minute against the first: p99 x{flat['p99_ratio']}, "
               f"throughput x{flat['throughput_ratio']}, memory growth MB "
               + " ".join(f"{k}={v:+g}" for k, v in flat["rss_growth_mb"].items()))
    if as_json:
        click.echo(json.dumps(out))
