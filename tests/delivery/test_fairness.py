"""One team never slows, stalls or reads another: its schemas, its patterns, its event ids; and inside a team, one
consumer's dead endpoint does not slow the others."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.models import Event, EventType

BACKTRACKING = "^(a+)+$"  # Python's re takes 2^n steps on "a" * n + "!"


def test_a_backtracking_pattern_is_matched_in_linear_time(producer):
    """With Python's re this ingest would run for longer than the universe has existed (2^8000 steps),
    in a web thread every team shares; RE2 answers at once."""
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": BACKTRACKING}},
              "patternProperties": {BACKTRACKING: {"type": "integer"}}}
    assert producer.post("/api/v1/event-types", {"name": "a.b", "schema": schema}).status_code == 201
    resp = producer.post("/api/v1/events", {"type": "a.b", "data": {"code": "a" * 8000 + "!"}})
    assert resp.status_code == 422 and "does not match" in resp.get_json()["error"]
    resp = producer.post("/api/v1/events", {"type": "a.b", "data": {"a" * 4000: "not an integer"}})
    assert resp.status_code == 422 and "is not of type 'integer'" in resp.get_json()["error"]
    assert producer.post("/api/v1/events", {"type": "a.b", "data": {"code": "aaaa", "aa": 2}}).status_code == 202


@pytest.mark.parametrize("pattern", [r"^(a)\1$", r"^(?=a)a$", r"(?<!b)a", "(?P<x>a)(?P=x)"])
def test_a_pattern_re2_cannot_match_is_refused_at_declaration(producer, pattern):
    for schema in ({"properties": {"x": {"type": "string", "pattern": pattern}}},
                   {"patternProperties": {pattern: {}}},
                   {"propertyNames": {"pattern": pattern}}):
        resp = producer.post("/api/v1/event-types", {"name": "a.b", "schema": schema})
        assert resp.status_code == 422 and "RE2" in resp.get_json()["error"], resp.get_json()
    assert db.session.scalar(select(func.count()).select_from(EventType)) == 0


def test_a_pattern_inside_an_enum_is_data_not_a_pattern(producer):
    schema = {"enum": [{"pattern": r"(a)\1"}]}
    assert producer.post("/api/v1/event-types", {"name": "a.b", "schema": schema}).status_code == 201
    assert producer.post("/api/v1/events", {"type": "a.b", "data": {"pattern": r"(a)\1"}}).status_code == 202
    assert db.session.scalar(select(func.count()).select_from(Event)) == 1


@pytest.mark.parametrize("fields, words", [
    ({"event_types": ["file.*"] * 101}, "at most 100 type names or patterns"),
    ({"event_types": ["file.[a-z]*"]}, "type names or patterns"),
    ({"event_types": ["file?"]}, "type names or patterns"),
    ({"event_types": ["has space"]}, "type names or patterns"),
    ({"event_types": ["x" * 201]}, "type names or patterns"),
    ({"event_versions": {f"type.{n}": 1 for n in range(101)}}, "at most 100 event types"),
    ({"event_versions": {"file.*": 2}}, "event_versions must be an object mapping"),
    ({"event_versions": {"": 2}}, "event_versions must be an object mapping"),
])
def test_routing_follows_the_type_grammar_and_a_count_limit(producer, fields, words):
    """20,000 patterns made each of that team's ingests take over a second: a hundred is the cap."""
    from dashboard.models import Subscription

    resp = producer.post("/api/v1/subscriptions", {"url": "https://example.com/", **fields})
    assert resp.status_code == 400 and words in resp.get_json()["error"], resp.get_json()
    assert db.session.scalar(select(func.count()).select_from(Subscription)) == 0


def test_routing_at_the_limits_is_accepted(producer):
    resp = producer.post("/api/v1/subscriptions", {
        "url": "https://example.com/", "event_types": [f"type.{n}.*" for n in range(100)],
        "event_versions": {f"type.{n}.x": 1 for n in range(100)}})
    assert resp.status_code == 201, resp.get_json()


# -- one team, several consumers: one consumer's dead endpoint does not slow the others -------------------------
SLOW_BACKLOG = 40
FAST_CONSUMERS, FAST_EVENTS = 3, 5


def test_one_consumers_hanging_endpoint_does_not_slow_the_same_teams_other_consumers(app, producer, receiver, clock):
    """Issue 37: consumers are subscriptions' owners inside one team, and the drain shares a team's slots between
    its waiting subscriptions in turn (fair_shares.FairShares.may_start). Consumer "stuck" has an endpoint that hangs past its
    timeout, allowed the whole worker, and a backlog of 40; three other consumers have 5 events each. In the same
    drain every one of theirs is delivered, and before the stuck endpoint's first round of requests is over: at
    most one worker's slots of its requests reach it before the others' last one (without the share, the 40 would
    go ahead of them, 8 at a time)."""
    from dashboard.delivery.engine import DeliveryEngine
    from dashboard.queue.work import WorkQueue

    app.config.update(PROMESA_MAX_IN_FLIGHT=8)
    producer.put_consumer("stuck")
    producer.subscribe(receiver.url + "/slow/3/stuck", consumer="stuck", max_in_flight=8, attempt_timeout=0.5)
    for _ in range(SLOW_BACKLOG):  # its backlog is claimed first
        assert producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": "stuck"}).status_code == 202
    fast_paths = []
    for n in range(FAST_CONSUMERS):
        producer.put_consumer(f"fine-{n}")
        producer.subscribe(receiver.url + f"/ok/fine-{n}", consumer=f"fine-{n}")
        fast_paths.append(f"/ok/fine-{n}")
        for _ in range(FAST_EVENTS):
            assert producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": f"fine-{n}"}).status_code == 202

    stats = DeliveryEngine(app, WorkQueue.for_app(app), clock).drain(None, 20)

    with receiver.lock:
        paths = [r.path for r in receiver.requests]
    assert stats.succeeded == FAST_CONSUMERS * FAST_EVENTS  # every other consumer's event, in this drain
    assert sorted(p for p in paths if p != "/slow/3/stuck") == sorted(fast_paths * FAST_EVENTS)
    assert paths.count("/slow/3/stuck") == stats.attempted - stats.succeeded > 8  # the stuck one was worked on too
    last_fast = max(i for i, p in enumerate(paths) if p in fast_paths)
    stuck_before = paths[:last_fast].count("/slow/3/stuck")
    assert stuck_before <= 8, (stuck_before, paths[:last_fast + 1])
    assert stats.peak_by_team[str(producer.team.id)] >= 8  # a lone team still uses every slot


# A consumer whose first event comes while another consumer of its team holds every slot with slow requests is
# popped and started beside them, as a newcomer team would be (fair_shares.FairShares.concentrated_teams, may_start).
def test_a_consumer_arriving_while_another_of_its_team_holds_every_slot_is_not_held_back(
        app, producer, receiver, clock):
    from dashboard.delivery.engine import DeliveryEngine
    from dashboard.queue.work import WorkQueue

    app.config.update(PROMESA_MAX_IN_FLIGHT=8)
    producer.put_consumer("stuck")
    producer.put_consumer("fine")
    producer.subscribe(receiver.url + "/slow/1.5/stuck", consumer="stuck", max_in_flight=8)
    producer.subscribe(receiver.url + "/ok/fine", consumer="fine")
    for _ in range(3):
        assert producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": "fine"}).status_code == 202
    work = WorkQueue.for_app(app)
    fine_items = work.pop_ready(100)  # fine's work arrives later, while stuck holds every slot
    for _ in range(10):
        assert producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": "stuck"}).status_code == 202
    arriving = threading.Timer(0.4, work.push, [fine_items])
    arriving.start()
    try:
        stats = DeliveryEngine(app, work, clock).drain(None, 20)
    finally:
        arriving.join()
    assert stats.succeeded == 13
    with receiver.lock:
        order = [r.path for r in receiver.requests]
    # As for a newcomer team: it starts past the worker's slots, before any of stuck's requests ends (the 9th to
    # 11th requests to reach the receivers are fine's, none of stuck's second round).
    assert order[:8] == ["/slow/1.5/stuck"] * 8 and order[8:11] == ["/ok/fine"] * 3, order
    assert 8 < stats.peak_in_flight <= 16
