"""`promesa bench --soak`, tiny: three two-second "minutes" on SQLite with a prune from the second one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from promesa_bench.soak import flatness, plot_svg

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_soak_samples_every_process_each_minute_with_a_prune_running(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["PROMESA_INSTANCE_PATH"] = str(tmp_path)
    plot = tmp_path / "soak.svg"
    done = subprocess.run(
        [sys.executable, "-m", "dashboard.cli", "bench", "--soak", "3", "--soak-minute-seconds", "2", "--rate", "10",
         "--workers", "1", "--soak-prune-rows", "300", "--history", "0", "--timeout", "60", "--plot", str(plot),
         "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    soak = json.loads(done.stdout.strip().splitlines()[-1])["soak"]

    assert [s["minute"] for s in soak["samples"]] == [1, 2, 3]
    assert soak["events_a_minute"] == 20 and all(s["complete"] for s in soak["samples"])
    assert soak["prune_started_minute"] == 2
    for sample in soak["samples"]:
        assert {"web-0", "web-1", "web-2", "worker-0", "sweeper"} <= set(sample["rss_mb"])
        assert all(mb > 5 for mb in sample["rss_mb"].values())
        assert sample["p99_ms"] >= sample["p50_ms"] > 0
    assert "pruner" not in soak["samples"][0]["rss_mb"]
    assert set(soak["flat"]) == {"rss_growth_mb", "p99_ratio", "throughput_ratio"}
    svg = plot.read_text()
    assert svg.count("<polyline") >= 5 + 2 + 1 and "prune starts" in svg


def test_flatness_compares_the_last_minute_with_the_first_after_warming_up():
    samples = [{"rss_mb": {"web-1": 90.0, "pruner": 40.0}, "p99_ms": 500, "deliveries_per_s": 50},
               {"rss_mb": {"web-1": 100.0, "pruner": 41.0}, "p99_ms": 100, "deliveries_per_s": 100},
               {"rss_mb": {"web-1": 104.5}, "p99_ms": 150, "deliveries_per_s": 95}]
    assert flatness(samples) == {"rss_growth_mb": {"web-1": 4.5}, "p99_ratio": 1.5, "throughput_ratio": 0.95}


def test_the_plot_escapes_process_names_and_marks_the_prune():
    soak = {"prune_started_minute": 2, "samples": [
        {"rss_mb": {"<w>": 1.0}, "p99_ms": 1, "p50_ms": 1, "deliveries_per_s": 1},
        {"rss_mb": {"<w>": 2.0}, "p99_ms": 2, "p50_ms": 1, "deliveries_per_s": 2}]}
    svg = plot_svg(soak)
    assert "&lt;w&gt;" in svg and "<w>" not in svg and "prune starts" in svg
