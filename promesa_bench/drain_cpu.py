"""`promesa bench --drain-cpu`: one drain's own CPU per delivery, apart from everything else on the machine.

With the workers stopped, each round publishes --events events (batches of 100) to one endpoint that answers
at once, then runs `DeliveryEngine.drain` in this process until every delivery is recorded, and reads this
process's CPU time around it: the drain loop, its claims and records through the database driver, its Redis
calls and the HTTP client. The receiver, the database, Redis and the web run in processes of their own, so
the figure follows the engine's Python, and a busy machine slows it down without adding to it.

A change that only moves the engine's code is checked by running this on both sides, alternated
(docs/performance-log.md, 2026-12-06, "the split measured again").
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import statistics
import time

import click

from dashboard.core.clock import utcnow
from dashboard.core.extensions import db
from dashboard.delivery.engine import DeliveryEngine
from dashboard.ingest import quotas
from dashboard.models import TeamQuota
from dashboard.queue.work import WorkQueue
from promesa_bench.harness import Run, _publish

BATCH = 100
# A drain that took nothing: the rest waits in Redis's scheduled set (paced hand-backs), promoted as it comes due.
IDLE_WAIT_SECONDS = 0.2


def drain_cpu_command(events: int, rounds: int, publishers: int, slow_seconds: float, timeout: float, keep: bool,
                      as_json: bool, log) -> None:
    started = dt.datetime.now(dt.timezone.utc)
    with Run(1, 2, slow_seconds, keep, log) as run:  # its workers are never started: this process drains
        run.make_team(1, 0)
        with run.app.app_context():  # every delivery stays owed until this process drains it
            db.session.merge(TeamQuota(team_id=run.team_id, name="queued_deliveries", value=1_000_000_000,
                                       updated_at=utcnow(), updated_by="bench"))
            db.session.commit()
            quotas.publish_limits([run.team_id])
            db.session.remove()
        log(f"bench {run.run_id}: one drain in this process, {rounds} rounds of {events} events to one endpoint; "
            f"{run.database} + {run.redis_kind}")
        rounds_out = []
        for r in range(rounds):
            sent, errors, _, _ = asyncio.run(_publish(run.web_url + "/api/v1/events", run.token, events,
                                                      publishers, None, batch=BATCH))
            measured = _drain(run, len(sent), timeout)
            rounds_out.append({"accepted": len(sent), "publish_errors": errors, **measured})
            log(f"  round {r + 1}: {measured['delivered']} delivered, {measured['cpu_ms_per_delivery']} ms of CPU each, "
                f"{measured['per_s']} deliveries/s")
    out = {
        "started_at": started.isoformat(timespec="seconds"), "database": run.database, "redis": run.redis_kind,
        "events_per_round": events, "rounds": rounds_out,
        "cpu_ms_per_delivery_median": statistics.median(r["cpu_ms_per_delivery"] for r in rounds_out),
        "complete": all(r["delivered"] == r["accepted"] for r in rounds_out),
    }
    click.echo(f"one drain: {out['cpu_ms_per_delivery_median']} ms of CPU per delivery (median of {rounds} rounds)")
    if as_json:
        click.echo(json.dumps(out))
    if not out["complete"]:
        raise click.ClickException("some deliveries were not delivered within --timeout")


def _drain(run: Run, expected: int, timeout: float) -> dict:
    """Drain in this process until `expected` deliveries succeeded (or `timeout`): its CPU and wall time."""
    with run.app.app_context():
        work = WorkQueue.for_app(run.app)
        engine = DeliveryEngine(run.app, work, run.app.config["CLOCK"], keep_alive=True)
        delivered = 0
        cpu_started, started = time.process_time(), time.monotonic()
        try:
            while delivered < expected and time.monotonic() - started < timeout:
                stats = engine.drain(None, timeout, 0.0)
                delivered += stats.succeeded
                if not stats.claimed:
                    time.sleep(IDLE_WAIT_SECONDS)
                    work.promote_due(time.time())
        finally:
            cpu, seconds = time.process_time() - cpu_started, time.monotonic() - started
            engine.close()
            db.session.remove()
    return {"delivered": delivered, "cpu_ms_per_delivery": round(cpu * 1000 / max(delivered, 1), 4),
            "per_s": round(delivered / seconds, 1)}
