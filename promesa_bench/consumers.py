"""`promesa bench --consumers N`: addressed delivery at scale.

N consumers of one team, each with one endpoint (/ok/<uid>), and the team's own endpoint (/ok/0). With the
workers stopped, rounds alternate four kinds of publishing, each timed on its own: single events
unaddressed (to the team's endpoint), single events addressed round robin over the consumers, and the same
two in batches. Then the workers deliver everything, and every request the receiver got is checked against
the database: the event's consumer must be the one whose path it arrived at, and every delivery must arrive.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import statistics
import time

import click
from sqlalchemy import func, insert, select

from dashboard.core import crypto
from dashboard.core.clock import utcnow
from dashboard.core.extensions import db
from dashboard.core.ids import new_ids
from dashboard.models import Consumer, Delivery, DeliveryState, Event, Subscription, TeamQuota
from promesa_bench.harness import Run, _publish

KINDS = ("single unaddressed", "single addressed", "batch unaddressed", "batch addressed")
SEED_CHUNK = 5000


def seed_consumers(run: Run, n: int) -> list[str]:
    """N consumers of the run's team, each with one subscription to the receiver at /ok/<uid>; their uids."""
    uids = [f"cus-{k:06d}" for k in range(n)]
    now = utcnow()
    with run.app.app_context():
        for name, value in (("consumers", max(n, 1)), ("queued_deliveries", 1_000_000_000)):
            db.session.merge(TeamQuota(team_id=run.team_id, name=name, value=value, updated_at=now,
                                       updated_by="bench"))
        db.session.commit()
        ciphertext = crypto.encrypt("whsec_" + "b" * 32)  # one secret for all: the bench does not verify them
        for start in range(0, n, SEED_CHUNK):
            chunk = uids[start:start + SEED_CHUNK]
            ids = db.session.execute(insert(Consumer).returning(Consumer.id, Consumer.uid), [
                {"team_id": run.team_id, "uid": uid, "name": f"Customer {uid}", "state": "active",
                 "created_at": now, "updated_at": now} for uid in chunk]).all()
            by_uid = {uid: consumer_id for consumer_id, uid in ids}
            db.session.execute(insert(Subscription), [
                {"id": sub_id, "team_id": run.team_id, "consumer_id": by_uid[uid],
                 "url": f"{run.receiver_url}/ok/{uid}",
                 "description": "", "event_types": ["*"], "event_versions": {}, "retry_policy": "exponential",
                 "signature_scheme": "promesa", "state": "active", "secret_ciphertext": ciphertext,
                 "connect_timeout": 5.0, "attempt_timeout": 10.0, "max_age_seconds": 86400,
                 "created_at": now, "updated_at": now}
                for uid, sub_id in zip(chunk, new_ids("sub", len(chunk)))])
            db.session.commit()
        db.session.remove()
    run.analyze("consumers", "subscriptions")
    return uids


def _publish_phase(run: Run, events: int, publishers: int, batch: int, consumers: list[str] | None,
                   offset: int) -> dict:
    # Round robin over the consumers, continuing where the previous addressed phase stopped.
    rotated = consumers[offset % len(consumers):] + consumers[:offset % len(consumers)] if consumers else None
    sent, errors, first, last = asyncio.run(_publish(run.web_url + "/api/v1/events", run.token, events, publishers,
                                                     None, batch=batch, consumers=rotated))
    return {"accepted": len(sent), "errors": errors, "per_s": round(len(sent) / (last - first), 1)}


def check_received(run: Run, expected: int, timeout: float) -> dict:
    """Wait for every delivery, then match each request's path with its event's consumer (the database's)."""
    with run.app.app_context():
        subs = select(Subscription.id).where(Subscription.team_id == run.team_id)
        deadline = time.monotonic() + timeout
        started = time.monotonic()
        done = 0
        while time.monotonic() < deadline:
            done = db.session.scalar(select(func.count()).select_from(Delivery).where(
                Delivery.subscription_id.in_(subs), Delivery.state == DeliveryState.SUCCEEDED))
            db.session.remove()
            if done >= expected:
                break
            time.sleep(0.5)
        seconds = time.monotonic() - started
        owner = dict(db.session.execute(select(Event.id, Consumer.uid).outerjoin(
            Consumer, Consumer.id == Event.consumer_id).where(Event.team_id == run.team_id)).all())
        db.session.remove()
    crossed = missing_event = 0
    seen, reached = set(), set()
    for path, event_id, _at in run.received():
        if event_id not in owner:
            missing_event += 1
            continue
        if path != (owner[event_id] or "0"):
            crossed += 1
        seen.add((path, event_id))
        if owner[event_id]:
            reached.add(path)
    return {"expected": expected, "recorded": done, "received": len(seen), "crossed": crossed,
            "unknown_events": missing_event, "consumers_reached": len(reached), "delivery_seconds": round(seconds, 1),
            "complete": done >= expected and len(seen) >= expected and crossed == 0}


def consumers_command(n: int, events: int, batch: int, rounds: int, workers: int, web_workers: int, publishers: int,
                      slow_seconds: float, timeout: float, keep: bool, as_json: bool, log) -> None:
    started = dt.datetime.now(dt.timezone.utc)
    batch = batch if batch > 1 else 100
    with Run(workers, web_workers, slow_seconds, keep, log) as run:
        run.make_team(1, 0)
        seeding = time.monotonic()
        uids = seed_consumers(run, n)
        log(f"bench {run.run_id}: {n} consumers with one endpoint each seeded in {time.monotonic() - seeding:.1f} s; "
            f"{rounds} rounds of {events} events per kind, batches of {batch}; {run.database} + {run.redis_kind}")
        rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
        total, errors, addressed_so_far = 0, 0, 0
        for r in range(rounds):
            # Alternated, so that a machine slowing down or speeding up falls on every kind alike.
            order = KINDS if r % 2 == 0 else tuple(reversed(KINDS))
            for kind in order:
                addressed = kind.endswith(" addressed")
                phase = _publish_phase(run, events, publishers, batch if kind.startswith("batch") else 1,
                                       uids if addressed else None, addressed_so_far)
                rates[kind].append(phase["per_s"])
                total += phase["accepted"]
                errors += phase["errors"]
                if addressed:
                    addressed_so_far += events
                log(f"  round {r + 1} {kind:20s} {phase['per_s']} events/s ({phase['errors']} errors)")
        run.reset_receiver()
        run.start_workers()
        checked = check_received(run, total, timeout)
    medians = {kind: statistics.median(values) for kind, values in rates.items()}
    # Each round's addressed phase over its unaddressed neighbour (they ran back to back), then the median of those:
    # a machine whose speed drifts between rounds moves both sides of a pair alike.
    pairs = {way: [round(a / u, 3) for a, u in zip(rates[f"{way} addressed"], rates[f"{way} unaddressed"]) if u]
             for way in ("single", "batch")}
    out = {
        "started_at": started.isoformat(timespec="seconds"), "database": run.database, "redis": run.redis_kind,
        "consumers": n, "events_per_phase": events, "rounds": rounds, "batch": batch, "publishers": publishers,
        "web_workers": web_workers, "workers": workers, "publish_errors": errors, "rates": rates,
        "medians": medians,
        "round_ratios": pairs,
        "single_ratio": statistics.median(pairs["single"]), "batch_ratio": statistics.median(pairs["batch"]),
        **checked,
    }
    click.echo(f"{n} consumers, {rounds} rounds of {events} events per kind (median events/s):")
    for kind in KINDS:
        click.echo(f"  {kind:20s} {medians[kind]:>9}   rounds: {', '.join(str(v) for v in rates[kind])}")
    click.echo(f"addressed / unaddressed, median of the rounds' ratios: single {out['single_ratio']} "
               f"({', '.join(map(str, pairs['single']))}), batch {out['batch_ratio']} "
               f"({', '.join(map(str, pairs['batch']))})")
    click.echo(f"delivered {checked['recorded']}/{checked['expected']} in {checked['delivery_seconds']} s; "
               f"received {checked['received']} at {checked['consumers_reached']} consumers' endpoints and the "
               f"team's own; crossed to another consumer's endpoint: {checked['crossed']}")
    if as_json:
        click.echo(json.dumps(out, sort_keys=True))
    if not out["complete"] or errors:
        click.echo("INCOMPLETE: a delivery is missing, crossed, or a publish failed", err=True)
        raise SystemExit(1)
