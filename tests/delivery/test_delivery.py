"""The delivery promises, end to end: API -> database -> Redis -> HTTP to a real receiver."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import hmac
import json
import re
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from dashboard.delivery import engine as engine_module
from dashboard.delivery.engine import DeliveryEngine
from dashboard.core.extensions import db
from dashboard.models import Attempt, Delivery, Event, Subscription
from dashboard.queue.work import WorkQueue

from tests.support.pipeline import deliver_due
from tests.support.waiting import wait_until


def delivery_of(event_id) -> Delivery:
    db.session.expire_all()
    return db.session.scalar(select(Delivery).join(Delivery.event).where(Event.id == event_id))


def attempts_of(delivery_id):
    return db.session.scalars(select(Attempt).where(Attempt.delivery_id == delivery_id).order_by(Attempt.number)).all()


def independent_verify(secret: str, header: str, body: bytes, now: float, tolerance=300) -> bool:
    """Stripe's algorithm written out again here, not imported from Promesa."""
    items = [part.split("=", 1) for part in header.split(",")]
    t = int(next(v for k, v in items if k == "t"))
    expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return abs(now - t) <= tolerance and any(hmac.compare_digest(expected, v) for k, v in items if k == "v1")


def test_it_delivers_a_signed_thin_event(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/ok")
    accepted = producer.publish("file.updated", {"resource_id": "f_123", "resource_version": 7})
    assert accepted["deliveries"] == 1

    deliver_due(app, clock)

    assert receiver.count("/ok") == 1
    got = receiver.requests[0]
    body = json.loads(got.body)
    assert body["id"] == accepted["id"] and body["type"] == "file.updated" and body["version"] == 1
    assert body["data"] == {"resource_id": "f_123", "resource_version": 7}
    assert body["timestamp"].endswith("Z")
    assert got.headers["Content-Type"] == "application/json"
    assert got.headers["X-Event-Id"] == accepted["id"]
    assert got.headers["X-Event-Type"] == "file.updated"
    assert independent_verify(sub["secret"], got.headers["X-Signature"], got.body, _unix(clock))
    assert not independent_verify("whsec_wrong", got.headers["X-Signature"], got.body, _unix(clock))
    d = delivery_of(accepted["id"])
    assert d.state == "succeeded" and d.attempt_count == 1 and d.succeeded_at is not None
    [a] = attempts_of(d.id)
    assert a.status_code == 200 and a.error is None and a.response_excerpt.startswith("status 200")


def _unix(clock):
    from dashboard.core.clock import unix
    return unix(clock.now())


def test_it_retries_503_then_succeeds_with_the_same_id_and_body(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/flaky/1")
    accepted = producer.publish()
    deliver_due(app, clock)
    d = delivery_of(accepted["id"])
    assert d.state == "scheduled" and d.last_status_code == 503
    wait = (d.next_attempt_at - clock.now()).total_seconds()
    assert 15 <= wait <= 30  # 30 s with equal jitter

    assert deliver_due(app, clock) == 0  # not due yet: nothing is sent early
    clock.advance(seconds=wait)
    deliver_due(app, clock)

    d = delivery_of(accepted["id"])
    assert d.state == "succeeded" and d.attempt_count == 2
    first, second = receiver.requests
    assert first.body == second.body  # id and timestamp identical on every retry
    assert first.headers["X-Event-Id"] == second.headers["X-Event-Id"] == accepted["id"]
    assert [a.status_code for a in attempts_of(d.id)] == [503, 200]


def test_a_slow_answer_is_a_timeout(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/slow/1.5", attempt_timeout=0.3)
    accepted = producer.publish()
    deliver_due(app, clock)
    d = delivery_of(accepted["id"])
    assert d.state == "scheduled" and d.last_error == "timeout"
    [a] = attempts_of(d.id)
    assert a.status_code is None and a.error == "timeout" and a.duration_ms < 1500


def test_redirects_are_never_followed(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/redirect")
    accepted = producer.publish()
    deliver_due(app, clock)
    d = delivery_of(accepted["id"])
    assert d.state == "scheduled" and d.last_status_code == 302
    [a] = attempts_of(d.id)
    assert a.error == "redirect not followed"
    assert receiver.count("/redirect-target") == 0


def test_a_private_address_is_refused_when_sending_too(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/hook")  # saved while private targets were allowed
    accepted = producer.publish()
    app.config["PROMESA_ALLOW_PRIVATE_TARGETS"] = False
    try:
        deliver_due(app, clock)
    finally:
        app.config["PROMESA_ALLOW_PRIVATE_TARGETS"] = True
    d = delivery_of(accepted["id"])
    [a] = attempts_of(d.id)
    assert d.state == "scheduled" and a.error == "private address refused" and a.status_code is None
    assert receiver.count("/hook") == 0


def test_cookies_a_receiver_sets_are_never_sent_to_anyone(app, producer, receiver, clock):
    """Endpoints of different teams share hosts: a cookie one of them sets must not reach the others."""
    by_name = receiver.url.replace("127.0.0.1", "localhost")  # a host name: cookie jars skip IP addresses
    producer.subscribe(by_name + "/cookie")
    producer.subscribe(by_name + "/ok")
    engine = DeliveryEngine(app, WorkQueue.for_app(app), clock, keep_alive=True)  # as a worker keeps it
    try:
        for _ in range(2):
            producer.publish()
            assert engine.drain(None, 20).succeeded == 2
    finally:
        engine.close()
    assert len(receiver.requests) == 4
    assert not [r.path for r in receiver.requests if "Cookie" in r.headers]


def test_drains_run_on_uvloop_where_it_is_installed_and_on_asyncio_without(app, producer, receiver, clock,
                                                                          monkeypatch):
    import asyncio
    import builtins

    import uvloop

    loops = []
    real = engine_module.new_event_loop
    monkeypatch.setattr(engine_module, "new_event_loop", lambda: loops.append(real()) or loops[-1])
    producer.subscribe(receiver.url + "/ok")
    for keep_alive in (False, True):
        engine = DeliveryEngine(app, WorkQueue.for_app(app), clock, keep_alive=keep_alive)
        try:
            producer.publish()
            assert engine.drain(None, 20).succeeded == 1
        finally:
            engine.close()
    assert [type(loop) for loop in loops] == [uvloop.Loop, uvloop.Loop]

    imported = builtins.__import__

    def no_uvloop(name, *args, **kwargs):
        if name == "uvloop":
            raise ImportError("uvloop is not installed here")
        return imported(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uvloop)
    engine = DeliveryEngine(app, WorkQueue.for_app(app), clock)
    producer.publish()
    assert engine.drain(None, 20).succeeded == 1
    assert type(loops[-1]) is not uvloop.Loop and isinstance(loops[-1], asyncio.BaseEventLoop)
    assert receiver.count("/ok") == 3


def test_a_4xx_stops_after_three_attempts(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/status/400")
    accepted = producer.publish()
    for _ in range(5):
        deliver_due(app, clock)
        clock.advance(hours=1)
    d = delivery_of(accepted["id"])
    assert d.state == "dead" and d.attempt_count == 3 and d.dead_lettered_at is not None
    assert receiver.count("/status/400") == 3


def test_410_disables_the_subscription_and_holds_its_deliveries(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/status/410")
    first = producer.publish()
    deliver_due(app, clock)
    assert delivery_of(first["id"]).state == "held"
    assert db.session.get(Subscription, sub["id"]).state == "disabled"
    assert "410" in db.session.get(Subscription, sub["id"]).state_reason

    later = producer.publish()  # a disabled subscription keeps accumulating, unsent
    deliver_due(app, clock)
    assert delivery_of(later["id"]).state == "held"
    assert receiver.count() == 1


def test_429_honours_retry_after_within_the_schedule(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/ratelimit/600")
    accepted = producer.publish()
    deliver_due(app, clock)
    d = delivery_of(accepted["id"])
    assert d.state == "scheduled" and d.last_status_code == 429
    assert (d.next_attempt_at - clock.now()).total_seconds() == pytest.approx(600, abs=1)


def test_it_dead_letters_after_the_last_attempt(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/status/500")
    accepted = producer.publish()
    start = clock.now()
    deliver_due(app, clock)
    for _ in range(7):
        d = delivery_of(accepted["id"])
        assert d.state == "scheduled"
        clock.set(d.next_attempt_at)
        deliver_due(app, clock)
    d = delivery_of(accepted["id"])
    assert d.state == "dead" and d.attempt_count == 8
    assert receiver.count() == 8
    span = clock.now() - start
    # 30 s + 2 m + 8 m + 32 m + 128 m + 512 m + 24 h, each between half and all of its nominal delay
    assert dt.timedelta(hours=18) <= span <= dt.timedelta(hours=37)
    assert [a.number for a in attempts_of(d.id)] == list(range(1, 9))


def test_quick_then_sweep_policy(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/status/503", retry_policy="quick-then-sweep", max_age_seconds=300)
    accepted = producer.publish()
    deliver_due(app, clock)
    delays = []
    while True:
        d = delivery_of(accepted["id"])
        if d.state != "scheduled":
            break
        delays.append((d.next_attempt_at - clock.now()).total_seconds())
        clock.set(d.next_attempt_at)
        deliver_due(app, clock)
    assert delays[:2] == [0.5, 0.5]
    assert set(delays[2:]) == {60.0}
    assert d.state == "dead" and d.attempt_count == 2 + 1 + 4  # three quick, then one a minute for 5 minutes


def test_the_readmes_quick_policy_makes_a_dead_letter_within_seconds(app, producer, receiver, clock):
    """README step 5: the edit it shows puts a subscription whose receiver is down on a policy that gives up within
    seconds (the default takes about 1.5 days), so a newcomer sees a dead letter and replays it."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    edit = json.loads(re.search(r"-X PATCH .*\n.*-d '([^']+)'", readme).group(1))
    sub = producer.subscribe(receiver.url + "/status/503")
    assert producer.client.patch(f"/api/v1/subscriptions/{sub['id']}", json=edit,
                                 headers=producer.headers()).status_code == 200
    accepted, published_at = producer.publish(), clock.now()
    deliver_due(app, clock)
    while (d := delivery_of(accepted["id"])).state == "scheduled":
        clock.set(d.next_attempt_at)
        deliver_due(app, clock)
    assert d.state == "dead" and d.dead_lettered_at - published_at <= dt.timedelta(seconds=5)


def test_pause_holds_then_resume_delivers(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/ok")
    assert producer.post(f"/api/v1/subscriptions/{sub['id']}/pause").status_code == 200
    ids = [producer.publish()["id"] for _ in range(3)]
    deliver_due(app, clock)
    assert receiver.count() == 0
    assert {delivery_of(i).state for i in ids} == {"held"}

    resp = producer.post(f"/api/v1/subscriptions/{sub['id']}/resume")
    assert resp.status_code == 200 and resp.get_json()["released"] == 3
    deliver_due(app, clock)
    assert {delivery_of(i).state for i in ids} == {"succeeded"}
    assert sorted(json.loads(r.body)["id"] for r in receiver.requests) == sorted(ids)


def test_replay_sends_a_dead_letter_again(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/status/400")
    accepted = producer.publish()
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(hours=1)
    assert delivery_of(accepted["id"]).state == "dead"
    resp = producer.post(f"/api/v1/subscriptions/{sub['id']}/replay")
    assert resp.status_code == 202 and resp.get_json() == {"replayed": 1}
    deliver_due(app, clock)
    d = delivery_of(accepted["id"])
    assert d.attempt_count == 4 and d.state == "scheduled"  # a fresh schedule: 4xx gets three more tries
    assert json.loads(receiver.requests[-1].body)["id"] == accepted["id"]


def test_a_delivery_is_never_claimed_twice(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/ok")
    accepted = producer.publish()
    d = delivery_of(accepted["id"])
    work = WorkQueue.for_app(app)
    first, _ = DeliveryEngine(app, work, clock).ledger.claim([d.id])
    second, _ = DeliveryEngine(app, work, clock).ledger.claim([d.id])
    assert len(first) == 1 and second == []


def test_waiting_work_is_sent_while_the_next_claim_is_under_way(app, producer, receiver, clock, monkeypatch):
    """The database leasing the next batch must not stall the endpoint: work already claimed and
    waiting for its subscription's turn keeps going out meanwhile."""
    app.config["PROMESA_MAX_IN_FLIGHT_PER_SUBSCRIPTION"] = 1  # one at a time: the rest of a claim waits here
    monkeypatch.setattr(engine_module, "POP_BATCH", 6)  # two claims of six
    producer.subscribe(receiver.url + "/ok")
    for _ in range(12):
        producer.publish()
    engine = DeliveryEngine(app, WorkQueue.for_app(app), clock)
    claim, received_during_claims = engine.ledger.claim, []

    def claim_that_waits_for_the_first_batch(ids):
        if received_during_claims:  # the second claim: hold it until the first six have arrived
            with receiver.arrived:
                receiver.arrived.wait_for(lambda: len(receiver.requests) >= 6, timeout=5)
        received_during_claims.append(len(receiver.requests))
        return claim(ids)

    engine.ledger.claim = claim_that_waits_for_the_first_batch
    assert engine.drain(None, 20).succeeded == 12
    assert received_during_claims == [0, 6]


@contextlib.contextmanager
def draining(engine: DeliveryEngine):
    """A drain in a thread of its own while the test pushes work; yields the list its stats end up in."""
    drained = []
    thread = threading.Thread(target=lambda: drained.append(engine.drain(None, 30, linger_seconds=0.5)))
    thread.start()
    try:
        yield drained
    finally:
        thread.join(30)


def arrive_one_by_one(work: WorkQueue, items: list[str]) -> None:
    for item in items:
        time.sleep(0.02)
        work.push([item])


def test_work_arriving_one_delivery_at_a_time_is_claimed_a_few_at_a_time(app, producer, receiver, clock,
                                                                        monkeypatch):
    """A pop, a claim and their thread hand-offs cost nearly as much for one delivery as for twenty: after
    a pop that empties the list, the drain lets arrivals gather before the next. The first delivery after
    a quiet spell still goes at once."""
    monkeypatch.setattr(engine_module, "GATHER_SECONDS", 3.0)  # wide: a slow machine cannot split the arrivals
    producer.subscribe(receiver.url + "/ok")
    for _ in range(10):
        producer.publish()
    work = WorkQueue.for_app(app)
    items = work.pop_ready(100)  # taken back, to arrive again one at a time
    assert len(items) == 10
    engine = DeliveryEngine(app, work, clock)
    with draining(engine) as drained:
        work.push(items[:1])
        assert wait_until(lambda: receiver.count("/ok") == 1, timeout=2.5)  # at once, not after a gather
        arrive_one_by_one(work, items[1:])
    [stats] = drained
    assert stats.succeeded == 10 and receiver.count("/ok") == 10
    assert stats.claims == 2, stats  # the first alone, then the nine that arrived one by one


def test_a_pop_that_cannot_fill_the_in_flight_slots_lets_arrivals_gather(app, producer, receiver, clock,
                                                                        monkeypatch):
    """Twenty-five arriving together are fewer than the 64 the drain can send at once: it still gathers
    after them, so the five that follow one by one are claimed together (a fixed threshold of 20 sent
    each of them on its own claim)."""
    monkeypatch.setattr(engine_module, "GATHER_SECONDS", 3.0)  # wide: a slow machine cannot split the arrivals
    producer.subscribe(receiver.url + "/ok")
    for _ in range(31):
        producer.publish()
    work = WorkQueue.for_app(app)
    items = work.pop_ready(100)
    engine = DeliveryEngine(app, work, clock)
    assert engine.max_in_flight == 64
    with draining(engine) as drained:
        work.push(items[:1])
        assert wait_until(lambda: receiver.count("/ok") == 1, timeout=2.5)  # at once, not after a gather
        work.push(items[1:26])
        assert wait_until(lambda: receiver.count("/ok") == 26, timeout=10)
        arrive_one_by_one(work, items[26:])
    [stats] = drained
    assert stats.succeeded == 31 and receiver.count("/ok") == 31
    assert stats.claims == 3, stats  # the first, the twenty-five, then the five


def test_a_pop_that_fills_the_in_flight_slots_is_followed_at_once(app, producer, receiver, clock, monkeypatch):
    """A worker with enough to send does not wait for arrivals: with 4 slots, pops of 4 and 8 both fill
    them, so the drain never gathers and ends once idle for its linger."""
    monkeypatch.setattr(engine_module, "GATHER_SECONDS", 10.0)  # a gather would hold the drain this long
    producer.subscribe(receiver.url + "/ok")
    for _ in range(12):
        producer.publish()
    app.config["PROMESA_MAX_IN_FLIGHT"] = 4
    engine = DeliveryEngine(app, WorkQueue.for_app(app), clock)
    started = time.monotonic()
    stats = engine.drain(None, 30, linger_seconds=0.2)
    assert stats.succeeded == 12 and receiver.count("/ok") == 12
    assert time.monotonic() - started < 10.0  # it did not gather (which cannot end before 10 s)


@pytest.mark.postgres
@pytest.mark.planner
def test_the_claim_finds_its_rows_by_primary_key_when_statistics_are_stale(app, producer, receiver, clock,
                                                                           database_url):
    """A queue table's statistics are always behind: ANALYZEd while nothing was due, then thousands
    turn due. A claim planned through ix_deliveries_due then reads every due row for each batch."""
    if not database_url.startswith("postgresql"):
        pytest.skip("a PostgreSQL planner question")
    from sqlalchemy import text

    from dashboard.delivery.ledger import _CLAIM_AND_LOAD
    from dashboard.ingest.accept import ingest_many
    from dashboard.schemas import EventInput

    producer.subscribe(receiver.url + "/ok")
    db.session.execute(text("ANALYZE deliveries"))  # the statistics say: no delivery is due
    db.session.commit()
    for _ in range(10):
        ingest_many(producer.team, [EventInput(type="file.updated", data={"n": n}) for n in range(500)])
    ids = db.session.scalars(select(Delivery.id).limit(10)).all()  # few, so a full scan is worse too
    now = clock.now()
    claim = _CLAIM_AND_LOAD.compile(dialect=db.engine.dialect).construct_expanded_state(
        {"ids": ids, "now": now, "token": "t", "until": now})
    plan = "\n".join(db.session.connection().exec_driver_sql("EXPLAIN " + claim.statement, claim.parameters).scalars())
    db.session.rollback()
    assert "deliveries_pkey" in plan and "ix_deliveries_due" not in plan and "Seq Scan on deliveries" not in plan, plan


@pytest.mark.postgres
def test_a_claim_on_postgresql_is_one_statement_in_autocommit(app, producer, receiver, clock, database_url):
    """Work arriving an event at a time is claimed a delivery or two at a time: BEGIN and COMMIT around
    the claim's one statement (atomic on its own) tripled its round trips."""
    if not database_url.startswith("postgresql"):
        pytest.skip("the PostgreSQL claim")
    from sqlalchemy import event

    producer.subscribe(receiver.url + "/ok")
    accepted = producer.publish()
    engine = DeliveryEngine(app, WorkQueue.for_app(app), clock)
    delivery_id = delivery_of(accepted["id"]).id
    seen = []

    def record(conn, cursor, statement, parameters, context, executemany):
        seen.append((statement.split(None, 1)[0].upper(), conn.connection.dbapi_connection.autocommit))

    event.listen(engine.db_engine, "before_cursor_execute", record)
    try:
        claimed, token = engine.ledger.claim([delivery_id])
    finally:
        event.remove(engine.db_engine, "before_cursor_execute", record)
    assert [c.event_id for c in claimed] == [accepted["id"]] and token
    assert seen == [("WITH", True)], seen
    with engine.db_engine.connect() as conn:  # and the pooled connection is back in transactions
        assert not conn.connection.dbapi_connection.autocommit


def test_a_claim_sets_only_columns_no_index_holds():
    """PostgreSQL writes an UPDATE that changes no indexed column as a heap-only tuple in the
    page's free room (deliveries keep 30 % free): a claim then adds no index entries at all."""
    from dashboard.delivery.ledger import _CLAIM

    set_clause = str(_CLAIM.compile()).split(" SET ", 1)[1].split(" WHERE ", 1)[0]
    claimed = {assignment.split("=", 1)[0].strip() for assignment in set_clause.split(",")}
    indexed = {column.name for index in Delivery.__table__.indexes for column in index.columns}
    indexed |= {column.name for column in Delivery.__table__.primary_key}
    assert claimed == {"lease_token", "lease_expires_at"} and not claimed & indexed
    assert Delivery.__table__.dialect_options["postgresql"]["with"] == {"fillfactor": 70}


@pytest.mark.postgres
@pytest.mark.planner
def test_the_sweeper_condition_can_use_the_due_index_in_a_generic_plan(app, producer, receiver, clock,
                                                                        database_url):
    """ix_deliveries_due holds only rows with a next attempt. Its predicate must follow from
    "next_attempt_at <= :now" alone, so a prepared (generic) plan, which knows no parameter
    values, can still use it; a predicate on the state list could not be proven from parameters."""
    if not database_url.startswith("postgresql"):
        pytest.skip("a PostgreSQL planner question")
    producer.subscribe(receiver.url + "/ok")
    accepted = producer.publish()
    deliver_due(app, clock)
    assert delivery_of(accepted["id"]).next_attempt_at is None  # settled: out of the due index
    connection = db.session.connection()
    connection.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
    connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
    connection.exec_driver_sql("PREPARE due(varchar, varchar, timestamp) AS SELECT count(*) FROM deliveries "
                               "WHERE state IN ($1, $2) AND next_attempt_at <= $3")
    plan = "\n".join(connection.exec_driver_sql("EXPLAIN EXECUTE due('pending', 'scheduled', '2026-01-01')").scalars())
    connection.exec_driver_sql("DEALLOCATE due")
    definition = connection.exec_driver_sql(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_deliveries_due'").scalar_one()
    db.session.rollback()
    assert definition.endswith("WHERE (next_attempt_at IS NOT NULL)"), definition
    assert "ix_deliveries_due" in plan, plan


def test_a_succeeded_delivery_can_be_resent_by_id(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/ok")
    accepted = producer.publish()
    deliver_due(app, clock)
    d = delivery_of(accepted["id"])
    assert producer.post(f"/api/v1/subscriptions/{sub['id']}/replay").get_json() == {"replayed": 0}  # not dead
    resp = producer.post(f"/api/v1/subscriptions/{sub['id']}/replay", {"delivery_ids": [d.id]})
    assert resp.get_json() == {"replayed": 1}
    deliver_due(app, clock)
    first, second = receiver.requests
    assert first.body == second.body  # the same event, id and timestamp: a duplicate the receiver can spot
    assert delivery_of(accepted["id"]).attempt_count == 2


def test_the_producer_says_when_it_happened(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/ok")
    resp = producer.post("/api/v1/events", {"type": "a.b", "timestamp": "2026-11-29T19:00:00.250+01:00"})
    assert resp.status_code == 202
    deliver_due(app, clock)
    assert json.loads(receiver.requests[0].body)["timestamp"] == "2026-11-29T18:00:00.250Z"
    for bad in ("yesterday", "2026-11-29T18:00:00", 1764439200):
        resp = producer.post("/api/v1/events", {"type": "a.b", "timestamp": bad})
        assert resp.status_code == 400 and "RFC 3339" in resp.get_json()["error"]


def test_a_replay_restarts_the_quick_then_sweep_age(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/status/503", retry_policy="quick-then-sweep", max_age_seconds=120)
    accepted = producer.publish()
    deliver_due(app, clock)
    while (d := delivery_of(accepted["id"])).state == "scheduled":
        clock.set(d.next_attempt_at)
        deliver_due(app, clock)
    assert d.state == "dead"
    clock.advance(hours=2)  # long past the maximum age of the event
    producer.post(f"/api/v1/subscriptions/{sub['id']}/replay")
    deliver_due(app, clock)
    d = delivery_of(accepted["id"])
    assert d.state == "scheduled"  # a fresh schedule, not an instant death for an old event
    assert (d.next_attempt_at - clock.now()).total_seconds() == 0.5
