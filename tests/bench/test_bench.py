"""`promesa bench` end to end, tiny: its own receiver, gunicorn, workers, SQLite and embedded Redis.

A smoke test, not a timing test: every event must arrive and the JSON line must say so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_it_benchmarks_the_pipeline_and_the_raw_baseline(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["PROMESA_INSTANCE_PATH"] = str(tmp_path)  # the CLI's own app must not touch ./instance
    done = subprocess.run(
        [sys.executable, "-m", "dashboard.cli", "bench", "--events", "20", "--workers", "2", "--replay", "20",
         "--dashboard", "--dashboard-attempts", "200", "--rate-limit", "5", "--ingest-alone", "--prune-rows", "40",
         "--history", "200", "--timeout", "60", "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])

    assert result["database"] == "sqlite" and result["redis"] == "embedded"
    assert result["complete"] is True
    assert result["accepted"] == 20 and result["received"] == 20 and result["deliveries_recorded"] == 20
    assert result["deliveries_per_s"] > 0
    assert set(result["latency_ms"]) == {"p50", "p95", "p99", "max"}
    assert result["history"]["settled"] == 200  # another team's: never counted, never POSTed by the raw loop
    # The raw loop POSTs every event the run's team published: both phases' here (--ingest-alone).
    assert result["raw"]["requests"] == 40 and result["raw"]["failed"] == 0 and result["raw"]["per_s"] > 0
    assert result["ratio"] > 0
    assert result["replay"]["replayed"] == 20 and result["replay"]["delivered"] == 20
    assert set(result["dashboard"]["pages"]) >= {"overview", "subscription", "delivery", "event", "event_search_type",
                                                  "audit", "users", "tokens",
                                                  "dead_letters", "replay_progress"}
    assert result["dashboard"]["subscriptions"] == 100 and result["dashboard"]["dead_letters"] == 100  # the one event round: dead
    assert result["dashboard"]["dead_letter_counts"]["all"]["matching"] > 0
    assert "deliveries/s" in done.stdout and "ratio pipeline/raw" in done.stdout
    throttled = result["throttled"]  # the rate-limited endpoint beside the healthy one
    assert throttled["received"] >= 1 and throttled["busiest_second"] <= 5 + 1
    assert "rate-limited endpoint (5/s)" in done.stdout
    # The ingest baseline and ingest alone, measured in the same run, and their ratios.
    assert result["ingest_baseline"]["accepted"] == 20 and result["ingest_baseline"]["stored"] == 20
    assert result["ingest_baseline_per_s"] > 0 and result["ingest_alone"]["accepted"] == 20
    assert result["ingest_ratio"] == round(result["ingest_alone"]["ingest_events_per_s"]
                                           / result["ingest_baseline_per_s"], 3)
    assert result["end_to_end_over_ingest_alone"] > 0
    # The machine's CPU per phase, in all and by process (20 events take a few of the clock's 10 ms ticks, so
    # only the shape is checked here: tests/test_bench_cpu.py checks the figures). Ingest alone ran without
    # workers.
    ingest_cpu, delivery_cpu = result["ingest_alone"]["cpu"]["ingest"], result["ingest_alone"]["cpu"]["delivery"]
    for phase in (ingest_cpu, delivery_cpu, result["cpu"], result["ingest_baseline"]["cpu"]):
        assert phase["ms_per_unit"] >= 0 and phase["busy_share"] >= 0  # (over a few ticks, the share can top 1)
        assert {"web", "publisher", "receiver"} <= set(phase["ms_per_unit_by_process"])
    assert "workers" not in ingest_cpu["ms_per_unit_by_process"]
    assert "workers" in delivery_cpu["ms_per_unit_by_process"] and "workers" in result["cpu"]["ms_per_unit_by_process"]
    assert isinstance(result["underused_phases"], list)  # (20 events: too short to say)
    # The machine's speed in each phase (the metronome's CPU for its loop), and each ratio's drift.
    for phase in (ingest_cpu, result["cpu"], result["ingest_baseline"]["cpu"]):
        assert phase["metronome_ms"] > 0 and "metronome" in phase["ms_per_unit_by_process"]
    assert result["machine_drift"]["end_to_end_over_ingest_alone"] == round(
        result["cpu"]["metronome_ms"] / ingest_cpu["metronome_ms"], 3)
    assert result["machine_drift"]["ingest_ratio"] == round(
        ingest_cpu["metronome_ms"] / result["ingest_baseline"]["cpu"]["metronome_ms"], 3)
    assert "the metronome's CPU for the same loop" in done.stdout
    assert result["raw"]["metronome_ms"] > 0
    assert result["machine_drift"]["ratio"] == round(result["raw"]["metronome_ms"] / result["cpu"]["metronome_ms"], 3)
    # Each page's time, and what of it the database took.
    delivery_page = result["dashboard"]["pages"]["delivery"]
    assert delivery_page["statements"] > 0 and 0 < delivery_page["sql_p50_ms"] < delivery_page["p50_ms"]
    assert "end to end, by process:" in done.stdout and "the baseline's CPU of the whole machine" in done.stdout
    # Delivery during a prune: every seeded row is pruned by the end, deliveries complete either way.
    prune = result["prune"]
    assert prune["rows"] == 40 and prune["left"] == 0 and prune["prune_exit"] == 0
    assert prune["without"]["complete"] and prune["with_prune"]["complete"] and prune["ratio"] > 0


@pytest.mark.slow
@pytest.mark.postgres
def test_it_benchmarks_on_postgresql_and_leaves_the_database_as_it_found_it(tmp_path, redis_url):
    import sqlalchemy as sa

    from tests.conftest import _migrate, fresh_postgres_database

    with fresh_postgres_database("promesa_bench_test") as database_url:
        _migrate(database_url)
        env = dict(os.environ, DATABASE_URL=database_url, REDIS_URL=redis_url, PROMESA_INSTANCE_PATH=str(tmp_path))
        done = subprocess.run(
            [sys.executable, "-m", "dashboard.cli", "bench", "--events", "30", "--workers", "1", "--batch", "10",
             "--no-raw", "--history", "500", "--timeout", "60", "--json"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["database"] == "postgresql" and result["redis"] == "redis"
        assert result["complete"] is True and result["deliveries_recorded"] == 30
        assert result["history"]["settled"] == 500

        engine = sa.create_engine(database_url)
        with engine.connect() as conn:  # the run's teams (the history's too) and rows are gone, dead rows vacuumed
            assert conn.execute(sa.text("SELECT count(*) FROM deliveries")).scalar() == 0
            assert conn.execute(sa.text("SELECT count(*) FROM events")).scalar() == 0
            assert conn.execute(sa.text("SELECT count(*) FROM teams")).scalar() == 0
            vacuumed = conn.execute(sa.text(
                "SELECT last_vacuum IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'deliveries'")).scalar()
            # Each team's subscriptions were followed by an ANALYZE (plans made on a near-empty table go)
            analyzed = conn.execute(sa.text(
                "SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'subscriptions'")).scalar()
        engine.dispose()
        assert vacuumed and analyzed


@pytest.mark.postgres
def test_the_consumers_run_checks_every_delivery_against_its_consumer_and_cleans_up(tmp_path, redis_url):
    """`--consumers N` on PostgreSQL (ingest's own path, the route keys): every addressed event reached its own
    consumer's endpoint and no other, every consumer was reached, and the run's consumers are gone after."""
    import sqlalchemy as sa

    from tests.conftest import _migrate, fresh_postgres_database

    with fresh_postgres_database("promesa_bench_consumers") as database_url:
        _migrate(database_url)
        env = dict(os.environ, DATABASE_URL=database_url, REDIS_URL=redis_url, PROMESA_INSTANCE_PATH=str(tmp_path))
        done = subprocess.run(
            [sys.executable, "-m", "dashboard.cli", "bench", "--consumers", "30", "--events", "20", "--batch", "10",
             "--rounds", "1", "--workers", "1", "--timeout", "60", "--json"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["complete"] is True and result["publish_errors"] == 0
        assert result["expected"] == result["recorded"] == result["received"] == 80  # 4 kinds x 20 events
        assert result["crossed"] == 0 and result["consumers_reached"] == 30
        assert set(result["round_ratios"]) == {"single", "batch"} and result["single_ratio"] > 0
        engine = sa.create_engine(database_url)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM consumers")).scalar() == 0
            assert conn.execute(sa.text("SELECT count(*) FROM teams")).scalar() == 0
        engine.dispose()


@pytest.mark.slow
def test_the_scale_run_measures_every_phase_as_the_median_of_its_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["PROMESA_INSTANCE_PATH"] = str(tmp_path)
    plot = tmp_path / "scale.svg"
    done = subprocess.run(
        [sys.executable, "-m", "dashboard.cli", "bench", "--scale", "--events", "10", "--scale-settled", "50",
         "--scale-due", "10", "--history", "0", "--plot", str(plot), "--timeout", "60", "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    from promesa_bench.scale import RUNS_PER_PHASE

    rows = result["by_subscriptions"]
    assert [row["subscriptions"] for row in rows] == [1, 10, 100, 1000]
    for row in rows:  # the figure is the run of median throughput among the phase's runs
        assert row["complete"] and len(row["runs"]) == RUNS_PER_PHASE
        assert row["deliveries_per_s"] == sorted(row["runs"])[RUNS_PER_PHASE // 2]
        assert row["vs_one"] == round(row["deliveries_per_s"] / rows[0]["deliveries_per_s"], 3)
    history = result["history"]
    assert history["settled"] == 50 and history["full"]["complete"]
    assert len(history["empty_runs"]) == len(history["full_runs"]) == RUNS_PER_PHASE
    for pages in (history["empty_pages"], history["full_pages"]):
        assert set(pages) == {"index", "subscription", "subscription_dead", "subscription_page_2", "delivery"}
        assert all(page["statements"] > 0 and 0 < page["sql_p50_ms"] < page["p50_ms"] for page in pages.values())
    speed = history["pages_metronome_ms"]
    assert history["pages_machine_drift"] == round(speed["full"] / speed["empty"], 3)
    assert result["sweeper"]["lost_pass"]["re_enqueued"] == 10 and result["sweeper"]["steady_pass"]["re_enqueued"] == 0
    assert plot.read_text().startswith("<svg")


def test_the_scale_plot_is_svg_with_every_figure():
    import xml.etree.ElementTree as ET

    from promesa_bench.scale import plot_svg

    rows = [{"subscriptions": n, "deliveries_per_s": v} for n, v in ((1, 400.0), (10, 390.5), (100, 380.0),
                                                                      (1000, 350.0))]
    svg = plot_svg({"events": 100, "batch": 1, "by_subscriptions": rows,
                    "history": {"settled": 2_000_000, "empty": {"deliveries_per_s": 410.0},
                                "full": {"deliveries_per_s": 395.0}}})
    texts = [t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert {"400", "390", "380", "350", "410", "395", "1000", "2,000,000 settled"} <= set(texts)


def test_a_phase_counts_only_its_own_succeeded_deliveries(app, producer, receiver, clock):
    """A subscription's settled history is not counted again on every poll: once it held 10,000,000 rows,
    the count took seconds, and the bench reported that as slow delivery."""
    import shutil

    from sqlalchemy import update

    from promesa_bench.harness import Run
    from dashboard.core.extensions import db
    from dashboard.models import Delivery, DeliveryState

    subscription_id = producer.subscribe(receiver.url + "/ok")["id"]
    producer.publish()
    clock.advance(days=2)
    phase_started = clock.now()
    producer.publish()
    producer.publish()
    db.session.execute(update(Delivery).values(state=DeliveryState.SUCCEEDED))
    db.session.commit()

    run = Run(1, 1, 1.0, False, print)
    run.app = app
    try:
        assert run.succeeded([subscription_id]) == 3
        assert run.succeeded([subscription_id], since=phase_started) == 2
    finally:
        shutil.rmtree(run.tmp, ignore_errors=True)


def test_a_bench_ended_by_sigterm_stops_every_process_it_started(tmp_path):
    """Else its gunicorn, workers and receiver run on, and take CPU from whatever is measured next."""
    import signal
    import time

    import psutil

    def command_of(process: psutil.Process) -> list[str]:
        try:
            return process.cmdline()
        except psutil.Error:  # it ended meanwhile
            return []

    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["PROMESA_INSTANCE_PATH"] = str(tmp_path)
    bench = subprocess.Popen([sys.executable, "-m", "dashboard.cli", "bench", "--events", "1000000", "--workers", "1",
                              "--web-workers", "1", "--no-raw", "--no-ingest-baseline", "--timeout", "120"],
                             cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        started = psutil.Process(bench.pid)
        deadline = time.monotonic() + 90
        children: list[psutil.Process] = []
        while time.monotonic() < deadline:  # until its worker is up: receiver, gunicorn and worker are running
            children = started.children(recursive=True)
            if any(command_of(c)[-2:] == ["dashboard.cli", "worker"] for c in children):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the bench never started its worker")
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(children, timeout=20)
        assert [command_of(c) for c in alive if c.status() != psutil.STATUS_ZOMBIE] == []
    finally:
        if bench.poll() is None:
            bench.kill()


@pytest.mark.slow
def test_the_drain_cpu_run_drains_every_delivery_in_its_own_process(tmp_path):
    """`--drain-cpu`: the workers never start, this process's drain delivers every event, and each round says
    its CPU per delivery."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["PROMESA_INSTANCE_PATH"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "dashboard.cli", "bench", "--drain-cpu", "--events", "300", "--rounds", "2",
         "--timeout", "60", "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["complete"] is True and len(result["rounds"]) == 2
    assert all(r["accepted"] == r["delivered"] == 300 and r["cpu_ms_per_delivery"] > 0 for r in result["rounds"])
    assert "workers ready" not in done.stderr  # no worker took any of it
    assert result["cpu_ms_per_delivery_median"] > 0
