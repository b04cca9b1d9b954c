"""Fair delivery (docs/scheduler.md): ready work in Redis is served teams in turn, then a team's
subscriptions in turn; a drain shares its in-flight slots between the teams that want them, and a
lone team uses every slot."""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import pytest
import redis

from dashboard.delivery.engine import DeliveryEngine
from dashboard.operations.sweeper import sweep_once
from dashboard.queue.work import UNKNOWN_TEAM, WorkQueue, split_item, work_item

from ..conftest import Producer

TEAMS = {"a1": "A", "a2": "A", "b1": "B", "c1": "C"}


@pytest.fixture
def work(redis_url):
    """A queue of its own on the test's Redis, whose subscriptions' teams are TEAMS."""
    prefix = f"fair-{uuid.uuid4().hex[:10]}"
    conn = redis.Redis.from_url(redis_url)
    lookups = []

    def lookup(subs):
        lookups.append(sorted(subs))
        return {sub: TEAMS[sub] for sub in subs if sub in TEAMS}

    queue = WorkQueue(conn, prefix, prefix, 4, team_lookup=lookup)
    queue.lookups = lookups
    yield queue
    conn.delete(*conn.keys(f"{prefix}:*") or ["-"])


def items(sub: str, n: int) -> list[str]:
    return [work_item(sub, f"{sub}-{i}") for i in range(n)]


def subs_of(popped: list[str]) -> list[str]:
    return [split_item(item)[0] for item in popped]


def test_one_event_of_another_team_is_in_the_next_pop_whatever_is_queued_ahead(work):
    work.push(items("a1", 5000) + items("a2", 5000))
    work.push(items("b1", 1))
    popped = subs_of(work.pop_ready(200))
    assert popped.count("b1") == 1
    # Team A's part is split between its two subscriptions.
    assert abs(popped.count("a1") - popped.count("a2")) <= 1 and len(popped) == 200
    assert work.waiting_teams == {"A"} and work.ready_count() == 10000 - 199


def test_teams_take_turns_then_their_subscriptions(work):
    work.push(items("a1", 4) + items("a2", 4) + items("b1", 4) + items("c1", 2))
    order = [sub for _ in range(14) for sub in subs_of(work.pop_ready(1))]
    teams = [TEAMS[sub] for sub in order]
    assert teams[:6] == ["A", "B", "C"] * 2  # round robin between the teams
    assert teams[6:] == ["A", "B", "A", "B", "A", "A", "A", "A"]  # C, then B, empty: they left the ring
    assert [sub for sub in order if TEAMS[sub] == "A"] == ["a1", "a2"] * 4  # then between A's subscriptions
    assert work.pop_ready(10) == [] and work.ready_count() == 0 and work.waiting_teams == frozenset()
    # Empty queues leave nothing behind in Redis (but the map of teams).
    assert work.conn.keys(f"{work.prefix}:ready*") == [] and work.conn.exists(work.teams_key)


def test_a_pop_gives_every_team_an_equal_part(work):
    work.push(items("a1", 300) + items("b1", 300) + items("c1", 30))
    counts = Counter(TEAMS[sub] for sub in subs_of(work.pop_ready(200)))
    assert counts == {"C": 30, "A": 85, "B": 85}


def test_skipped_teams_keep_their_work_in_redis(work):
    work.push(items("a1", 50) + items("b1", 3))
    assert subs_of(work.pop_ready(100, ["A"])) == ["b1"] * 3
    assert work.pop_ready(100, ["A"]) == [] and work.waiting_teams == {"A"}
    assert subs_of(work.pop_ready(100)) == ["a1"] * 50


def test_promoted_retries_are_filed_under_their_team(work):
    work.schedule([(item, 100.0) for item in items("b1", 2) + items("a1", 2)])
    assert work.promote_due(100.0) == 4
    assert work.waiting_teams == frozenset()  # set by pops only
    assert Counter(TEAMS[s] for s in subs_of(work.pop_ready(2))) == {"A": 1, "B": 1}


def test_the_map_of_teams_is_asked_once_and_rebuilt_after_a_flush(work):
    work.push(items("a1", 2) + items("b1", 1) + items("gone", 1))
    work.push(items("a1", 1) + [work_item("gone", "again")])
    assert work.lookups == [["a1", "b1", "gone"], ["gone"]]  # this process remembers; the unknown is asked again
    assert work.conn.hgetall(work.teams_key) == {b"a1": b"A", b"b1": b"B"}
    assert sorted(subs_of(work.pop_ready(10, ["A", "B"]))) == ["gone", "gone"]  # the unknown team is a tenant of its own
    assert UNKNOWN_TEAM not in work.waiting_teams

    work.conn.delete(work.teams_key)  # a flushed Redis (this process still remembers)
    work.push(items("c1", 1))
    work.schedule([(items("a1", 1)[0], 1.0)])  # what it remembers, it writes to the map again for promotions
    assert work.conn.hget(work.teams_key, "a1") == b"A"
    fresh = WorkQueue(work.conn, work.prefix, work.prefix, 4, team_lookup=lambda subs: {s: TEAMS[s] for s in subs})
    assert fresh.teams_of(["a1", "c1"]) == {"a1": "A", "c1": "C"}


def test_the_sweeper_files_what_redis_lost_under_the_right_teams(app, client, receiver, clock):
    alpha, beta = Producer(client, "alpha"), Producer(app.test_client(), "beta")
    a, b = alpha.subscribe(receiver.url + "/ok"), beta.subscribe(receiver.url + "/ok")
    for _ in range(3):
        alpha.publish()
    beta.publish()
    work = WorkQueue.for_app(app)
    work.drop_ready()
    work.conn.delete(work.teams_key)
    work._team_of.clear()  # as a process started after the flush
    assert work.ready_count() == 0 and sweep_once(app, clock) == 4
    assert Counter(split_item(i)[0] for i in work.pop_ready(2)) == {a["id"]: 1, b["id"]: 1}
    assert work.waiting_teams == {str(alpha.team.id)}
    assert work.conn.hgetall(work.teams_key) == {a["id"].encode(): str(alpha.team.id).encode(),
                                                 b["id"].encode(): str(beta.team.id).encode()}


def drain(app, clock):
    engine = DeliveryEngine(app, WorkQueue.for_app(app), clock)
    return engine.drain(None, 20)


def drain_while_arriving(app, clock, items: list[str], after: float):
    """Drain while another team's `items` arrive in Redis `after` seconds in."""
    arriving = threading.Timer(after, WorkQueue.for_app(app).push, [items])
    arriving.start()
    try:
        return drain(app, clock)
    finally:
        arriving.join()


def test_a_lone_team_uses_every_idle_slot(app, producer, receiver, clock):
    app.config.update(PROMESA_MAX_IN_FLIGHT=8, PROMESA_MAX_IN_FLIGHT_PER_SUBSCRIPTION=4)
    for _ in range(4):
        producer.subscribe(receiver.url + "/slow/0.3")
    for _ in range(6):
        producer.publish()
    stats = drain(app, clock)
    assert stats.succeeded == 24
    # Fairness costs a lone team nothing: all the worker's slots, within its subscriptions' caps.
    assert stats.peak_in_flight == 8 and stats.peak_by_team == {str(producer.team.id): 8}
    assert stats.peak_shared_by_team == {}  # nobody else was waiting


def test_teams_waiting_together_share_the_slots(app, client, receiver, clock):
    app.config.update(PROMESA_MAX_IN_FLIGHT=8)
    alpha, beta = Producer(client, "alpha"), Producer(app.test_client(), "beta")
    alpha.subscribe(receiver.url + "/slow/0.6/alpha", max_in_flight=8)  # as much as the whole worker
    beta.subscribe(receiver.url + "/slow/0.6/beta", max_in_flight=8)
    for _ in range(12):
        alpha.publish()
        beta.publish()
    stats = drain(app, clock)
    assert stats.succeeded == 24
    # Each could fill the worker alone; together, while the other has work waiting, each holds half.
    assert stats.peak_shared_by_team == {str(alpha.team.id): 4, str(beta.team.id): 4}
    assert stats.peak_in_flight == 8


def test_a_team_holding_every_slot_does_not_hold_back_a_newcomer(app, client, receiver, clock):
    app.config.update(PROMESA_MAX_IN_FLIGHT=8)
    alpha, beta = Producer(client, "alpha"), Producer(app.test_client(), "beta")
    alpha.subscribe(receiver.url + "/slow/1.5/alpha", max_in_flight=8)
    beta.subscribe(receiver.url + "/ok")
    for _ in range(3):
        beta.publish()
    work = WorkQueue.for_app(app)
    beta_items = work.pop_ready(100)  # beta's work arrives later, while alpha holds every slot
    for _ in range(10):
        alpha.publish()
    stats = drain_while_arriving(app, clock, beta_items, after=0.4)
    assert stats.succeeded == 13
    alpha_at = sorted(r.at for r in receiver.requests if r.path.endswith("/alpha"))
    beta_at = [r.at for r in receiver.requests if r.path == "/ok"]
    assert len(beta_at) == 3 and max(beta_at) < alpha_at[0] + 1.5  # before alpha's first answer
    team_a, team_b = str(alpha.team.id), str(beta.team.id)
    assert stats.peak_by_team[team_a] == 8  # alone, alpha took every idle slot
    assert stats.peak_by_team[team_b] >= 1 and 8 < stats.peak_in_flight <= 16  # beta's share, past the slots


def test_work_waiting_here_that_cannot_start_does_not_keep_another_team_in_redis(app, client, receiver, clock):
    """Team A's subscriptions are each at their own cap, well below A's share: what waits of them here
    cannot start, and with that much claimed the drain's room is less than half free."""
    app.config.update(PROMESA_MAX_IN_FLIGHT=8)
    alpha, beta = Producer(client, "alpha"), Producer(app.test_client(), "beta")
    for n in range(3):
        alpha.subscribe(receiver.url + f"/slow/0.8/alpha{n}", max_in_flight=1, event_types=["a.*"])
    beta.subscribe(receiver.url + "/ok", event_types=["b.*"])
    beta.publish("b.thing")
    work = WorkQueue.for_app(app)
    beta_items = work.pop_ready(100)  # beta's work arrives later, while alpha's waits in the drain
    for _ in range(6):
        alpha.publish("a.thing")
    stats = drain_while_arriving(app, clock, beta_items, after=0.3)
    assert stats.succeeded == 19
    alpha_at = sorted(r.at for r in receiver.requests if "/alpha" in r.path)
    beta_at = [r.at for r in receiver.requests if r.path == "/ok"]
    assert len(beta_at) == 1 and beta_at[0] < alpha_at[0] + 0.8  # before alpha's first answer


def test_a_claim_for_a_subscription_whose_work_already_waits_here_is_taken(app, clock):
    """A team's work waiting here (the worker at twice its slots), then a claim of the same subscription's next
    delivery: its subscription was counted out twice among its team's (-1 others), and a ZeroDivisionError failed
    the drain, whose abandon then waited out a slow endpoint's requests while every team's new work waited."""
    import asyncio
    from dataclasses import fields

    from dashboard.delivery.engine import _Drain
    from dashboard.delivery.ledger import Claimed, DrainStats
    from dashboard.models import SubscriptionState

    app.config.update(PROMESA_MAX_IN_FLIGHT=2)
    engine = DeliveryEngine(app, WorkQueue.for_app(app), clock)

    def claimed(sub: str, team: str, n: int) -> Claimed:
        values = dict.fromkeys((f.name for f in fields(Claimed)), None)
        return Claimed(**values | {"delivery_id": f"{sub}-{n}", "subscription_id": sub, "team_id": team,
                                   "subscription_state": SubscriptionState.ACTIVE, "url": "http://127.0.0.1/"})

    async def taking():
        loop = asyncio.get_running_loop()
        engine.start = lambda *args, **kwargs: loop.create_future()  # on the wire until the test ends
        run = _Drain(engine, None, DrainStats())
        await run.take([], ([claimed(f"s{t}", f"T{t}", 0) for t in range(4)], "lease-1"))  # four newcomer teams
        assert run.shares.slots == 4  # twice the worker's slots: the hard bound
        await run.take([], ([claimed("b1", "B", 0), claimed("b1", "B", 1)], "lease-2"))
        assert run.shares.waiting_total == 2
        await run.take([], ([claimed("b1", "B", 2)], "lease-3"))
        assert run.shares.waiting_total == 3 and run.shares.slots == 4

    asyncio.run(taking())
