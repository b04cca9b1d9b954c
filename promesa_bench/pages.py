"""`promesa bench --dashboard`: seed a dashboard's worth of history and time every page.

At the default size: 100 subscriptions, 1,000,000 attempts (500,000 deliveries, two attempts
each), 100,000 of the deliveries dead letters, a week of outcome counts (a row per subscription per
minute) and 20,000 audit entries. On PostgreSQL the rows are made by the database itself
(INSERT ... SELECT FROM generate_series), in a minute or two; SQLite (the smoke test) gets the same
shapes from Python, at the small size it is run with. Pages are timed in-process with the Flask test
client: server time, no network.
"""

from __future__ import annotations

import datetime as dt

from dashboard import audit
from dashboard.core import crypto
from dashboard.core.extensions import db
from dashboard.core.ids import new_ids
from dashboard.models import AuditEntry, OutcomeCount, Subscription
from dashboard.stats import rollup
from promesa_bench import dead_letters as bench_dead_letters
from promesa_bench.harness import _seed, time_pages

SUBSCRIPTIONS = 100
# A team of its own with this many consumers, one endpoint each (issue 37: its pages at 100,000 consumers);
# SQLite (the smoke test) gets a few hundred, from Python.
CONSUMERS = 100_000
CONSUMERS_ELSEWHERE = 300
# The consumer whose page is timed: dead letters on its endpoint, and a day of outcome counts.
TIMED_DEAD_LETTERS = 1_000
WEEK_MINUTES = 7 * 24 * 60
AUDIT_ENTRIES = 20_000
# Per event (each goes to every subscription): every 5th dead-lettered, every 20th (offset 1) waiting for a retry.
STATE_SQL = "CASE WHEN (i / :per) % 5 = 0 THEN 'dead' WHEN (i / :per) % 20 = 1 THEN 'scheduled' ELSE 'succeeded' END"


def _state_of(i: int, per: int) -> str:
    n = i // per
    return "dead" if n % 5 == 0 else "scheduled" if n % 20 == 1 else "succeeded"


def _subscriptions(run, count: int) -> list[str]:
    from promesa_receiver import signing
    from sqlalchemy import insert

    ids = new_ids("sub", count)
    with run.app.app_context():
        secret = crypto.encrypt(signing.new_secret())
        now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        db.session.execute(insert(Subscription), [
            {"id": sub_id, "team_id": run.team_id, "url": f"{run.receiver_url}/ok/dashboard/{n}", "description": "",
             "event_types": ["*"], "event_versions": {}, "retry_policy": "exponential", "signature_scheme": "promesa",
             "state": "active", "secret_ciphertext": secret, "connect_timeout": 5.0, "attempt_timeout": 10.0,
             "max_age_seconds": 86400, "created_at": now, "updated_at": now} for n, sub_id in enumerate(ids)])
        db.session.commit()
        db.session.remove()
    return ids


def _execute_all(run, statements: list[str], params: dict) -> None:
    """PostgreSQL statements run in one transaction, with the same parameters."""
    from sqlalchemy import text

    with run.app.app_context():
        with db.engine.begin() as conn:
            for sql in statements:
                conn.execute(text(sql), params)
        db.engine.dispose()


def _seed_postgres(run, subs: list[str], deliveries: int, attempts_each: int, now: dt.datetime) -> None:
    params = {"p": f"seed{run.run_id}", "n": deliveries, "per": len(subs), "subs": subs, "team": run.team_id,
              "now": now, "each": attempts_each, "events": -(-deliveries // len(subs)),
              "minutes": WEEK_MINUTES, "audit": AUDIT_ENTRIES}
    rows = (f"SELECT i, {STATE_SQL} AS st, CAST(:now AS timestamp) - (:n - i) * interval '1 second' AS at "
            "FROM generate_series(0, :n - 1) i")
    statements = [
        # events: one per round of deliveries over the subscriptions
        "INSERT INTO events (key, id, team_id, type, version, data, body, resource_id, occurred_at, created_at) "
        "SELECT 'evt_' || :p || lpad(e::text, 10, '0'), 'evt_' || :p || lpad(e::text, 10, '0'), :team, 'bench.seed', 1, "
        "json_build_object('resource_id', 'r_' || e), "
        "'{\"id\":\"evt_' || :p || lpad(e::text, 10, '0') || '\",\"type\":\"bench.seed\",\"version\"\\:1,"
        "\"data\":{\"resource_id\":\"r_' || e || '\"}}', 'r_' || e, "
        "CAST(:now AS timestamp) - (:n - e * :per) * interval '1 second', "
        "CAST(:now AS timestamp) - (:n - e * :per) * interval '1 second' FROM generate_series(0, :events - 1) e",
        "INSERT INTO deliveries (id, event_key, subscription_id, state, attempt_count, retry_base, next_attempt_at, "
        "created_at, updated_at, last_status_code, succeeded_at, dead_lettered_at) "
        "SELECT 'dlv_' || :p || lpad(i::text, 12, '0'), 'evt_' || :p || lpad((i / :per)::text, 10, '0'), "
        "(CAST(:subs AS text[]))[i % :per + 1], st, :each, 0, CASE WHEN st = 'scheduled' THEN at END, at, at, "
        "CASE WHEN st = 'succeeded' THEN 200 ELSE 500 END, CASE WHEN st = 'succeeded' THEN at END, "
        f"CASE WHEN st = 'dead' THEN at END FROM ({rows}) g",
        "INSERT INTO attempts (delivery_id, number, attempted_at, duration_ms, status_code, error, response_excerpt) "
        "SELECT 'dlv_' || :p || lpad(i::text, 12, '0'), a, at, 3, "
        "CASE WHEN st = 'succeeded' AND a = :each THEN 200 ELSE 500 END, NULL, "
        f"CASE WHEN st = 'succeeded' AND a = :each THEN 'ok' ELSE 'upstream error' END FROM ({rows}) g "
        "CROSS JOIN generate_series(1, :each) a",
        # a week of outcome counts: a row per subscription per minute, about one in five minutes with a failure
        "INSERT INTO outcome_counts (subscription_id, minute, succeeded, failed, dead, duration_ms) "
        "SELECT s, date_trunc('minute', CAST(:now AS timestamp)) - m * interval '1 minute', "
        "1 + (random() * 2)::int, (random() < 0.2)::int, (random() < 0.05)::int, 30 "
        "FROM unnest(CAST(:subs AS text[])) s CROSS JOIN generate_series(0, :minutes - 1) m",
        "INSERT INTO audit_entries (at, actor_kind, actor, action, team_id, subscription_id, deliveries, detail) "
        "SELECT CAST(:now AS timestamp) - k * interval '30 seconds', 'user', 'ops@bench.local', "
        "(ARRAY['subscription.paused', 'subscription.resumed', 'deliveries.replayed'])[k % 3 + 1], :team, "
        "(CAST(:subs AS text[]))[k % :per + 1], k % 50, NULL FROM generate_series(0, :audit - 1) k",
    ]
    _execute_all(run, statements, params)


def _seed_elsewhere(run, subs: list[str], deliveries: int, attempts_each: int, now: dt.datetime) -> None:
    """The same shapes from Python (SQLite, small sizes): the bench's generic seeding, then outcomes
    (a row per subscription per hour of the week, to stay quick) and some audit entries."""
    from sqlalchemy import insert

    per = len(subs)
    _seed(run, "seed", subs, deliveries, attempts_each, lambda i: _state_of(i, per))
    with run.app.app_context():
        minute = now.replace(second=0, microsecond=0)
        db.session.execute(insert(OutcomeCount), [
            {"subscription_id": s, "minute": minute - dt.timedelta(hours=h), "succeeded": 60, "failed": h % 5,
             "dead": h % 20 == 0, "duration_ms": 1800} for s in subs for h in range(7 * 24)])
        db.session.execute(insert(AuditEntry), [
            audit.entry_values("subscription.paused", at=now - dt.timedelta(seconds=30 * k), actor=("user", "ops@bench.local"),
                               team_id=run.team_id, subscription_id=subs[k % per]) for k in range(200)])
        db.session.commit()
        db.session.remove()


def _delivery_id(run, i: int) -> str:
    return f"dlv_seed{run.run_id}{i:012d}"


def pages_to_time(run, subs: list[str], deliveries: int) -> dict[str, str]:
    sub = subs[0]
    per = len(subs)
    middle = deliveries // 2
    event_index = (deliveries // 3) // per
    event_id = f"evt_seed{run.run_id}{event_index:010d}"
    return {
        "overview": "/",
        "subscription": f"/subscriptions/{sub}",
        "subscription_dead": f"/subscriptions/{sub}?state=dead",
        "subscription_page_2": f"/subscriptions/{sub}?before={_delivery_id(run, middle)}",
        "subscription_filtered": f"/subscriptions/{sub}?type=bench.seed&status=500",
        "delivery": f"/deliveries/{_delivery_id(run, deliveries // 3)}",
        "event": f"/events/{event_id}",
        "event_search_id": f"/events?q={event_id}",
        "event_search_resource": f"/events?q=r_{event_index}",
        "event_search_type": "/events?q=bench.seed&by=type",
        "audit": "/audit",
        "audit_subscription": f"/audit?subscription={sub}",
        "users": "/users",
        "tokens": "/tokens",
    }


def run_dashboard(run, attempts: int, samples: int, consumers: int = CONSUMERS) -> dict:
    """Seed `attempts` attempt rows (two per delivery) over SUBSCRIPTIONS new subscriptions, a week of
    outcome counts and audit entries; then time every page `samples` times as an admin. Then a team of
    `consumers` consumers, and its consumers pages timed (after the others: those list every subscription)."""
    import time

    deliveries = max(SUBSCRIPTIONS, attempts // 2)
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    seeded_at = time.monotonic()
    subs = _subscriptions(run, SUBSCRIPTIONS)
    (_seed_postgres if run.database == "postgresql" else _seed_elsewhere)(run, subs, deliveries, 2, now)
    seed_seconds = time.monotonic() - seeded_at
    # A week old installation has rolled up each hour as it ended (the first page after it does);
    # here the whole week at once, timed on its own.
    rolled_at = time.monotonic()
    with run.app.app_context():
        rollup.roll_up(db.engine, rollup.hour_of(now - dt.timedelta(days=8)), rollup.hour_of(now - rollup.SETTLE))
        db.engine.dispose()
    roll_up_seconds = time.monotonic() - rolled_at
    run.vacuum()
    out = time_pages(run, lambda client: pages_to_time(run, subs, deliveries) | bench_dead_letters.pages(run, client),
                     samples)
    dead = sum(1 for i in range(deliveries) if _state_of(i, SUBSCRIPTIONS) == "dead")
    consumer_pages = run_consumers(run, consumers if run.database == "postgresql" else
                                   min(consumers, CONSUMERS_ELSEWHERE), samples, now)
    return {"consumers": consumer_pages, "attempts": deliveries * 2, "deliveries": deliveries, "dead_letters": dead, "subscriptions": SUBSCRIPTIONS,
            "seed_seconds": round(seed_seconds, 1), "roll_up_week_seconds": round(roll_up_seconds, 2),
            "samples": samples, "pages": out, "dead_letter_counts": bench_dead_letters.counts(run, samples)}


# -- a team of many consumers ----------------------------------------------------------------------------------
def _uid(n: int) -> str:
    return f"cus_{n:06d}"


def _consumer_team(run) -> int:
    from dashboard.models import Team

    with run.app.app_context():
        team = Team(name=f"bench-{run.run_id}-consumers")
        db.session.add(team)
        db.session.commit()
        run.team_ids.append(team.id)  # the run's cleanup removes its subscriptions, events and deliveries
        team_id = team.id
        db.session.remove()
    return team_id


def _seed_consumers_postgres(run, team_id: int, count: int, timed: int, now: dt.datetime) -> None:
    from promesa_receiver import signing

    with run.app.app_context():
        secret = crypto.encrypt(signing.new_secret())
    params = {"p": f"c{run.run_id}", "n": count, "team": team_id, "now": now, "timed": _uid(timed),
              "secret": secret, "url": f"{run.receiver_url}/ok/consumer/", "dead": TIMED_DEAD_LETTERS,
              "first_page": 50}
    statements = [
        "INSERT INTO consumers (team_id, uid, name, metadata, state, created_at, updated_at) "
        "SELECT :team, 'cus_' || lpad(i::text, 6, '0'), 'Customer ' || i, NULL, "
        "CASE WHEN i % 1000 = 7 THEN 'disabled' ELSE 'active' END, "
        "CAST(:now AS timestamp) - (:n - i) * interval '1 second', CAST(:now AS timestamp) "
        "FROM generate_series(0, :n - 1) i",
        "INSERT INTO subscriptions (id, team_id, consumer_id, url, description, event_types, event_versions, "
        "retry_policy, signature_scheme, state, secret_ciphertext, connect_timeout, attempt_timeout, max_age_seconds, "
        "created_at, updated_at) "
        "SELECT 'sub_' || :p || lpad(c.id::text, 12, '0'), :team, c.id, :url || c.uid, '', '[\"*\"]', '{}', "
        "'exponential', 'promesa', 'active', :secret, 5.0, 10.0, 86400, c.created_at, c.created_at "
        "FROM consumers c WHERE c.team_id = :team",
        # the timed consumer: events addressed to it, each a dead letter on its endpoint
        "INSERT INTO events (key, id, team_id, type, version, data, body, resource_id, consumer_id, occurred_at, "
        "created_at) "
        "SELECT 'evt_' || :p || lpad(e::text, 10, '0'), 'evt_' || :p || lpad(e::text, 10, '0'), :team, "
        "'invoice.paid', 1, json_build_object('resource_id', 'in_' || e), "
        "'{\"id\":\"evt_' || :p || lpad(e::text, 10, '0') || '\",\"type\":\"invoice.paid\"}', 'in_' || e, c.id, "
        "CAST(:now AS timestamp) - (:dead - e) * interval '1 minute', "
        "CAST(:now AS timestamp) - (:dead - e) * interval '1 minute' "
        "FROM consumers c CROSS JOIN generate_series(0, :dead - 1) e WHERE c.team_id = :team AND c.uid = :timed",
        "INSERT INTO deliveries (id, event_key, subscription_id, state, attempt_count, retry_base, created_at, "
        "updated_at, last_status_code, dead_lettered_at) "
        "SELECT 'dlv_' || :p || lpad(e::text, 12, '0'), 'evt_' || :p || lpad(e::text, 10, '0'), s.id, 'dead', 8, 0, "
        "CAST(:now AS timestamp) - (:dead - e) * interval '1 minute', CAST(:now AS timestamp), 503, "
        "CAST(:now AS timestamp) - (:dead - e) * interval '30 seconds' "
        "FROM subscriptions s JOIN consumers c ON c.id = s.consumer_id CROSS JOIN generate_series(0, :dead - 1) e "
        "WHERE c.team_id = :team AND c.uid = :timed",
        # a day of outcome counts for the first page's endpoints and the timed one's
        "INSERT INTO outcome_counts (subscription_id, minute, succeeded, failed, dead, duration_ms) "
        "SELECT s.id, date_trunc('minute', CAST(:now AS timestamp)) - m * interval '1 minute', "
        "1 + (random() * 2)::int, (random() < 0.2)::int, (random() < 0.05)::int, 30 "
        "FROM subscriptions s JOIN consumers c ON c.id = s.consumer_id CROSS JOIN generate_series(0, 1439) m "
        "WHERE c.team_id = :team AND (c.uid < 'cus_' || lpad(CAST(:first_page AS text), 6, '0') OR c.uid = :timed)",
    ]
    _execute_all(run, statements, params)


def _seed_consumers_elsewhere(run, team_id: int, count: int, timed: int, now: dt.datetime) -> None:
    """The same shapes from Python (SQLite, a few hundred consumers): consumers, one endpoint each, and the
    timed consumer's dead letters."""
    from promesa_receiver import signing
    from sqlalchemy import insert, select

    from dashboard.models import Consumer, Delivery, Event

    with run.app.app_context():
        db.session.execute(insert(Consumer), [
            {"team_id": team_id, "uid": _uid(i), "name": f"Customer {i}", "state": "active",
             "created_at": now, "updated_at": now} for i in range(count)])
        ids = dict(db.session.execute(select(Consumer.uid, Consumer.id).where(Consumer.team_id == team_id)).all())
        secret = crypto.encrypt(signing.new_secret())
        db.session.execute(insert(Subscription), [
            {"id": f"sub_c{run.run_id}{consumer_id:012d}", "team_id": team_id, "consumer_id": consumer_id,
             "url": f"{run.receiver_url}/ok/consumer/{uid}", "description": "", "event_types": ["*"],
             "event_versions": {}, "retry_policy": "exponential", "signature_scheme": "promesa", "state": "active",
             "secret_ciphertext": secret, "connect_timeout": 5.0, "attempt_timeout": 10.0, "max_age_seconds": 86400,
             "created_at": now, "updated_at": now} for uid, consumer_id in ids.items()])
        timed_id = ids[_uid(timed)]
        dead = min(TIMED_DEAD_LETTERS, 50)
        db.session.execute(insert(Event), [
            {"key": f"evt_c{run.run_id}{e:010d}", "id": f"evt_c{run.run_id}{e:010d}", "team_id": team_id,
             "type": "invoice.paid", "version": 1, "data": {}, "body": "{}", "consumer_id": timed_id,
             "occurred_at": now, "created_at": now} for e in range(dead)])
        db.session.execute(insert(Delivery), [
            {"id": f"dlv_c{run.run_id}{e:012d}", "event_key": f"evt_c{run.run_id}{e:010d}",
             "subscription_id": f"sub_c{run.run_id}{timed_id:012d}", "state": "dead", "attempt_count": 8,
             "retry_base": 0, "created_at": now, "updated_at": now, "last_status_code": 503,
             "dead_lettered_at": now - dt.timedelta(seconds=e)} for e in range(dead)])
        db.session.commit()
        db.session.remove()


def _delete_consumers(run, team_id: int) -> None:
    """The team's endpoints, then its consumers (the run's cleanup removes the team). The endpoints' table is
    vacuumed between: each consumer deleted checks that no subscription names it, and no index leads there by
    consumer alone, so the check reads the table, which must not still hold 100,000 dead rows."""
    from sqlalchemy import delete, select

    from dashboard.models import Consumer, Delivery, Event, OutcomeCount

    with run.app.app_context():
        subs = select(Subscription.id).where(Subscription.team_id == team_id)
        db.session.execute(delete(OutcomeCount).where(OutcomeCount.subscription_id.in_(subs)))
        db.session.execute(delete(Delivery).where(Delivery.subscription_id.in_(subs)))
        db.session.execute(delete(Event).where(Event.team_id == team_id))
        db.session.execute(delete(Subscription).where(Subscription.team_id == team_id))
        db.session.commit()
        if run.database == "postgresql":
            with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM subscriptions")
        db.session.execute(delete(Consumer).where(Consumer.team_id == team_id))
        db.session.commit()
        db.session.remove()
        db.engine.dispose()


def run_consumers(run, count: int, samples: int, now: dt.datetime) -> dict:
    """A team of `count` consumers with one endpoint each; the timed consumer (in the middle) has dead letters.
    Times its consumers list (first page, a page deep in, a uid-prefix search, a name search) and the
    consumer's page, and the consumer filter of the dead-letter desk and the events page."""
    import time

    timed = count // 2
    seeded_at = time.monotonic()
    team_id = _consumer_team(run)
    (_seed_consumers_postgres if run.database == "postgresql" else _seed_consumers_elsewhere)(
        run, team_id, count, timed, now)
    seed_seconds = time.monotonic() - seeded_at
    run.vacuum()
    run.analyze("consumers", "subscriptions")
    uid = _uid(timed)
    pages = {
        "consumers": f"/consumers?team={team_id}",
        "consumers_deep_page": f"/consumers?team={team_id}&after={_uid(count - 60)}",
        "consumers_uid_prefix": f"/consumers?team={team_id}&q={uid[:-2]}",
        "consumers_name": f"/consumers?team={team_id}&q=customer+{timed}",
        "consumer": f"/consumers/{team_id}/{uid}",
        "consumer_events": f"/events?team={team_id}&consumer={uid}",
    }
    out = time_pages(run, pages, samples)
    for name, t in out.items():
        run.log(f"consumers: {name} p50 {t['p50_ms']} ms p95 {t['p95_ms']} ms")
    if not run.keep:
        _delete_consumers(run, team_id)
    return {"consumers": count, "timed_dead_letters": TIMED_DEAD_LETTERS if run.database == "postgresql"
            else min(TIMED_DEAD_LETTERS, 50), "seed_seconds": round(seed_seconds, 1), "pages": out}
