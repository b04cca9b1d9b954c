"""`promesa bench --soak MINUTES`: a steady rate for a long time, sampled each minute.

Each minute publishes `rate` events/s for sixty seconds and waits for their deliveries, then samples the
resident memory of every process of the service (web processes, workers, the sweeper, the pruner), the
minute's publish→receive p50/p99 and its deliveries/s. A third of the way in, `promesa prune` starts on
old settled deliveries seeded beforehand, so the samples show the service while retention runs.
"""

from __future__ import annotations

import html
import subprocess
import sys

import psutil

from promesa_bench.harness import Run, run_pipeline
from promesa_bench.scale import _idle_subscription, seed

MINUTE_SECONDS = 60


def _rss_mb(proc: psutil.Process) -> float | None:
    """Resident MB, or None for a process that has ended: a zombie (exited, not yet reaped) reads as 0 MB."""
    try:
        rss = proc.memory_info().rss
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return round(rss / 2**20, 1)


def service_memory(run: Run, extra: dict[str, subprocess.Popen]) -> dict[str, float]:
    """Resident MB of each of the service's processes, named by role (web-0 is gunicorn's arbiter)."""
    named: dict[str, psutil.Process] = {}
    web, *workers = run.children[:1 + run.workers]
    named["web-0"] = psutil.Process(web.pid)
    for i, child in enumerate(sorted(named["web-0"].children(), key=lambda p: p.pid), start=1):
        named[f"web-{i}"] = child
    for i, worker in enumerate(workers):
        named[f"worker-{i}"] = psutil.Process(worker.pid)
    for name, proc in extra.items():
        if proc.poll() is None:
            named[name] = psutil.Process(proc.pid)
    return {name: mb for name, proc in named.items() if (mb := _rss_mb(proc)) is not None}


def flatness(samples: list[dict]) -> dict:
    """Last minute against the first (after a warm-up minute when there are enough): memory growth per
    process in MB, and the ratios of p99 and throughput."""
    first = samples[1] if len(samples) > 2 else samples[0]
    last = samples[-1]
    growth = {name: round(last["rss_mb"][name] - mb, 1) for name, mb in first["rss_mb"].items()
              if name in last["rss_mb"] and not name.startswith(("pruner", "sweeper"))}

    def ratio(key):
        a, b = first[key], last[key]
        return round(b / a, 3) if a and b else None

    return {"rss_growth_mb": growth, "p99_ratio": ratio("p99_ms"), "throughput_ratio": ratio("deliveries_per_s")}


def run_soak(run: Run, minutes: int, rate: float, publishers: int, prune_rows: int, timeout: float, log,
             minute_seconds: float = MINUTE_SECONDS) -> dict:
    events_a_minute = max(1, int(rate * minute_seconds))
    prune_at = minutes // 3 if prune_rows else None
    if prune_rows:
        seed(run, "prune", _idle_subscription(run), prune_rows, 45, "succeeded")
    extra = {"sweeper": subprocess.Popen([sys.executable, "-m", "dashboard.cli", "sweep"], env=run.env,
                                         stdout=open(run.tmp / "sweeper.log", "wb"), stderr=subprocess.STDOUT)}
    run.children.append(extra["sweeper"])
    samples = []
    for minute in range(1, minutes + 1):
        if minute - 1 == prune_at:
            extra["pruner"] = subprocess.Popen([sys.executable, "-m", "dashboard.cli", "prune"], env=run.env,
                                               stdout=open(run.tmp / "prune.log", "wb"), stderr=subprocess.STDOUT)
            run.children.append(extra["pruner"])
        result = run_pipeline(run, events_a_minute, publishers, rate, timeout, False)
        pruning = "pruner" in extra and extra["pruner"].poll() is None
        sample = {"minute": minute, "deliveries_per_s": result["deliveries_per_s"],
                  "p50_ms": result["latency_ms"]["p50"], "p99_ms": result["latency_ms"]["p99"],
                  "complete": result["complete"], "pruning": pruning, "rss_mb": service_memory(run, extra)}
        samples.append(sample)
        log(f"soak minute {minute}/{minutes}: {sample['deliveries_per_s']} deliveries/s, p99 {sample['p99_ms']} ms"
            f"{', pruning' if pruning else ''}, MB " + " ".join(f"{k}={v}" for k, v in sample["rss_mb"].items()))
    return {"minutes": minutes, "rate": rate, "events_a_minute": events_a_minute, "prune_rows": prune_rows,
            "prune_started_minute": None if prune_at is None else prune_at + 1, "samples": samples,
            "flat": flatness(samples)}


def plot_svg(soak: dict) -> str:
    """Three stacked charts over the minutes: memory per process, p99 (and p50), deliveries/s."""
    samples = soak["samples"]
    width, height, pad, gap = 760, 170, 48, 34
    names = sorted({name for s in samples for name in s["rss_mb"]})
    panels = [("resident memory, MB", {n: [s["rss_mb"].get(n) for s in samples] for n in names}),
              ("publish → receive, ms", {"p99": [s["p99_ms"] for s in samples], "p50": [s["p50_ms"] for s in samples]}),
              ("deliveries/s", {"deliveries/s": [s["deliveries_per_s"] for s in samples]})]
    colours = ["#1f6feb", "#d1242f", "#1a7f37", "#8250df", "#bf8700", "#0a7ea4", "#cf222e", "#57606a", "#953800"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{(height + gap) * 3 + 20}" '
           'font-family="sans-serif" font-size="11">']
    n = max(len(samples), 2)
    for row, (title, series) in enumerate(panels):
        top = row * (height + gap) + 20
        values = [v for vs in series.values() for v in vs if v is not None]
        high = max(values or [1]) * 1.1 or 1
        x = lambda i: pad + i * (width - 2 * pad) / (n - 1)  # noqa: E731
        y = lambda v: top + height - v / high * height  # noqa: E731
        out.append(f'<text x="{pad}" y="{top - 6}" font-weight="bold">{html.escape(title)}</text>')
        out.append(f'<rect x="{pad}" y="{top}" width="{width - 2 * pad}" height="{height}" fill="none" stroke="#d0d7de"/>')
        out.append(f'<text x="{pad - 4}" y="{top + 10}" text-anchor="end">{high:.0f}</text>'
                   f'<text x="{pad - 4}" y="{top + height}" text-anchor="end">0</text>')
        if soak.get("prune_started_minute"):
            px = x(soak["prune_started_minute"] - 1)
            out.append(f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{top + height}" stroke="#bf8700" '
                       'stroke-dasharray="4 3"/>')
            if row == 0:
                out.append(f'<text x="{px + 3:.1f}" y="{top + 12}" fill="#bf8700">prune starts</text>')
        for k, (name, vs) in enumerate(series.items()):
            points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(vs) if v is not None)
            colour = colours[k % len(colours)]
            out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
            out.append(f'<text x="{width - pad + 4}" y="{top + 12 + 12 * k}" fill="{colour}">{html.escape(name)}</text>')
        out.append(f'<text x="{pad}" y="{top + height + 14}">minute 1</text>'
                   f'<text x="{width - pad}" y="{top + height + 14}" text-anchor="end">minute {len(samples)}</text>')
    out.append("</svg>")
    return "\n".join(out)
