"""Bulk replay as a job (SQLite and PostgreSQL, real Redis, real RQ worker, real receiver): it replays
exactly the matching dead letters, in chunks, with the right progress; a second click finds the running
one; cancel stops it; who may start one and what it may touch."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import event, select, update
from sqlalchemy.orm import Session

from dashboard.operations import replays
from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Delivery, Event, Replay, Subscription
from dashboard.queue import lanes
from dashboard.web.api import shapes

from tests.conftest import Producer
from tests.support.pipeline import deliver_due, run_worker


@pytest.fixture(autouse=True)
def _small_chunks(app):
    app.config["PROMESA_REPLAY_CHUNK"] = 2
    app.config["PROMESA_DRAIN_LINGER_SECONDS"] = 0.0  # a drain job ends as soon as the ready list is empty


def make_dead(app, clock, producer, receiver, status, events, deliver=deliver_due):
    """A subscription answering `status`, and one dead letter per (event type) in `events`, killed by
    the real pipeline (4xx: three attempts). Returns (subscription id, {delivery id: event id})."""
    sub = producer.subscribe(receiver.url + f"/status/{status}", event_types=sorted({t for t in events}))
    ids = [producer.publish(t)["id"] for t in events]
    for _ in range(3):
        deliver(app, clock)
        clock.advance(hours=1)
    rows = db.session.execute(select(Delivery.id, Event.id.label("event_id"), Delivery.state)
                              .join(Delivery.event).where(Delivery.subscription_id == sub["id"])).all()
    assert {r.state for r in rows} == {"dead"} and len(rows) == len(ids)
    return sub["id"], {r.id: r.event_id for r in rows}


def fix_receiver(sub_id, receiver):
    """The team repaired its endpoint: it answers 200 from now on."""
    db.session.execute(update(Subscription).where(Subscription.id == sub_id).values(url=receiver.url + "/ok"))
    db.session.commit()


def states(ids):
    return dict(db.session.execute(select(Delivery.id, Delivery.state).where(Delivery.id.in_(list(ids)))).all())


def test_the_job_replays_exactly_the_matching_dead_letters_in_chunks(app, producer, receiver, clock):
    sub_a, dead_a = make_dead(app, clock, producer, receiver, 400, ["file.updated"] * 3 + ["order.paid"] * 2)
    sub_b, dead_b = make_dead(app, clock, producer, receiver, 404, ["invoice.sent"])
    fix_receiver(sub_a, receiver)
    received_before = receiver.count()

    replay, started = replays.start(replays.DeadLetterFilter(subscription_id=sub_a, event_types=("file.updated",)))
    assert started and replay.state == "queued" and replay.total == 3 and replay.done == 0
    replay_id = replay.id
    assert f"replay-{replay_id}" in lanes.queue("repairs", app).job_ids  # enqueued after the commit; not run yet
    assert set(states(dead_a).values()) == {"dead"}

    chunks = []

    def count_chunks(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("UPDATE DELIVERIES"):
            chunks.append(statement)

    event.listen(db.engine, "before_cursor_execute", count_chunks)
    try:
        run_worker(app)
    finally:
        event.remove(db.engine, "before_cursor_execute", count_chunks)

    replay = db.session.get(Replay, replay_id)
    wanted = _of_type(dead_a, "file.updated")
    assert replay.state == "finished" and replay.done == 3 and replay.started_at and replay.finished_at
    assert len([s for s in chunks if "replay_id" in s]) == 2  # 3 dead letters, chunks of 2
    got = states([*dead_a, *dead_b])
    assert {d for d, s in got.items() if s != "dead"} == wanted  # exactly the matching ones
    assert all(got[d] == "succeeded" for d in wanted)
    sent = [json.loads(r.body)["id"] for r in receiver.requests[received_before:]]
    assert sorted(sent) == sorted(dead_a[d] for d in wanted)  # the receiver got each event once
    assert replays.outcomes(replay.id) == {"succeeded": 3, "failed": 0, "waiting": 0, "held": 0, "sent": 3,
                                           "discarded": 0}
    described = shapes.replay(replay)  # the API's view: outcomes counted live
    assert (described["done"], described["succeeded"], described["failed"]) == (3, 3, 0)
    actions = db.session.scalars(select(AuditEntry.action).where(AuditEntry.target == f"replay:{replay.id}")
                                 .order_by(AuditEntry.id)).all()
    assert actions == ["replay.started"]  # re-queued and delivered, but the sweeper has not looked yet
    assert replays.record_outcomes(clock.now()) == 1
    finished = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "replay.finished"))
    assert finished.detail == {"total": 3, "requeued": 3, "delivered": 3, "failed": 0, "held": 0, "waiting": 0}
    assert replays.record_outcomes(clock.now()) == 0  # once


def _of_type(dead, event_type):
    event_ids = set(db.session.scalars(select(Event.id).where(Event.type == event_type)))
    return {d for d, e in dead.items() if e in event_ids}


def test_a_finished_replay_tells_the_notification_sinks(app, producer, receiver, clock):
    from dashboard.operations import notifications
    from dashboard.models import Event

    sub, dead = make_dead(app, clock, producer, receiver, 400, ["file.updated"] * 2)
    notifications.add_sink("json", receiver.url + "/ok")
    db.session.commit()
    replay, _ = replays.start(replays.DeadLetterFilter(subscription_id=sub))
    replay_id = replay.id
    run_worker(app)
    [event] = db.session.scalars(select(Event).where(Event.type == "promesa.replay.finished")).all()
    assert event.data["replay_id"] == replay_id and event.data["replayed"] == 2
    assert event.data["url"].endswith(f"/replays/{replay_id}")


def test_filters_by_time_window_and_result(app, producer, receiver, clock):
    sub_a, dead_a = make_dead(app, clock, producer, receiver, 400, ["file.updated"] * 2)
    cut = clock.advance(minutes=1)
    sub_b, dead_b = make_dead(app, clock, producer, receiver, 404, ["order.paid"] * 3)
    everything = replays.DeadLetterFilter()
    assert replays.count(everything.where()) == 5
    assert replays.count(replays.DeadLetterFilter(since=cut).where()) == 3
    assert replays.count(replays.DeadLetterFilter(until=cut).where()) == 2
    assert replays.count(replays.DeadLetterFilter(result="404").where()) == 3
    assert replays.count(replays.DeadLetterFilter(result="4xx").where()) == 5
    assert replays.count(replays.DeadLetterFilter(result="5xx").where()) == 0
    rows, cursor = replays.page(everything.where(), None, 2)
    seen = [d.id for d in rows]
    while cursor:
        rows, cursor = replays.page(everything.where(), cursor, 2)
        seen += [d.id for d in rows]
    assert sorted(seen) == sorted([*dead_a, *dead_b]) and len(seen) == 5  # keyset pages cover each once


def test_a_second_click_shows_the_running_replay(app, producer, receiver, clock):
    sub, dead = make_dead(app, clock, producer, receiver, 400, ["file.updated"] * 3)
    first, started = replays.start(replays.DeadLetterFilter(subscription_id=sub))
    first_id = first.id
    again, started_again = replays.start(replays.DeadLetterFilter(subscription_id=sub))
    assert started and not started_again and again.id == first_id
    assert lanes.queue("repairs", app).job_ids.count(f"replay-{first_id}") == 1
    other, started_other = replays.start(replays.DeadLetterFilter(subscription_id=sub, result="400"))
    assert started_other and other.id != first_id  # another filter is another replay
    run_worker(app)
    assert db.session.get(Replay, first_id).state == "finished"
    # Once it has ended, the same filter starts afresh (here: nothing is dead any more).
    later, started_later = replays.start(replays.DeadLetterFilter(subscription_id=sub))
    assert started_later and later.id != first_id and later.total == 0 and later.state == "finished"


def test_cancel_stops_a_running_replay_between_chunks(app, producer, receiver, clock):
    sub, dead = make_dead(app, clock, producer, receiver, 400, ["file.updated"] * 5)
    replay, _ = replays.start(replays.DeadLetterFilter(subscription_id=sub))
    replay_id = replay.id
    commits = []

    def cancel_after_first_chunk(session):
        commits.append(1)
        if len(commits) == 2:  # 1: the job claimed the replay; 2: the first chunk is re-queued
            with db.engine.begin() as conn:  # another request, on its own connection
                conn.execute(update(Replay).where(Replay.id == replay_id).values(state="cancelled"))

    event.listen(Session, "after_commit", cancel_after_first_chunk)
    try:
        run_worker(app)
    finally:
        event.remove(Session, "after_commit", cancel_after_first_chunk)
    db.session.expire_all()
    replay = db.session.get(Replay, replay_id)
    assert replay.state == "cancelled" and replay.done == 2
    assert list(states(dead).values()).count("dead") == 3  # the first chunk went out; the rest stays dead
    assert len({d for d, in db.session.execute(select(Delivery.id).where(Delivery.replay_id == replay_id))}) == 2


def test_cancelling_before_it_starts_replays_nothing(app, producer, receiver, clock):
    sub, dead = make_dead(app, clock, producer, receiver, 400, ["file.updated"] * 2)
    replay, _ = replays.start(replays.DeadLetterFilter(subscription_id=sub))
    replay_id = replay.id
    assert replays.cancel(replay)
    assert not replays.cancel(db.session.get(Replay, replay_id))  # once only
    run_worker(app)
    assert db.session.get(Replay, replay_id).state == "cancelled"
    assert set(states(dead).values()) == {"dead"}
    actions = db.session.scalars(select(AuditEntry.action).where(AuditEntry.target == f"replay:{replay_id}")
                                 .order_by(AuditEntry.id)).all()
    assert actions == ["replay.started", "replay.cancelled"]


def test_a_failing_job_marks_the_replay_failed_and_lets_rq_see_it(app, producer, receiver, clock):
    sub, dead = make_dead(app, clock, producer, receiver, 400, ["file.updated"])
    replay, _ = replays.start(replays.DeadLetterFilter(subscription_id=sub))
    replay_id = replay.id
    db.session.execute(update(Replay).where(Replay.id == replay_id)
                       .values(filter={"since": "not a time"}))  # a row no job can read
    db.session.commit()
    run_worker(app)
    replay = db.session.get(Replay, replay_id)
    assert replay.state == "failed" and "since" in replay.error
    assert len(lanes.queue("repairs", app).failed_job_registry) == 1
    assert set(states(dead).values()) == {"dead"}


def test_replayed_deliveries_that_die_again_count_as_failed(app, producer, receiver, clock):
    sub, dead = make_dead(app, clock, producer, receiver, 400, ["file.updated"] * 2)
    replay, _ = replays.start(replays.DeadLetterFilter(subscription_id=sub))
    replay_id = replay.id
    run_worker(app)  # the endpoint still answers 400: three more attempts each
    assert replays.outcomes(replay_id) == {"succeeded": 0, "failed": 0, "waiting": 2, "held": 0, "sent": 0,
                                           "discarded": 0}
    for _ in range(3):
        clock.advance(hours=1)
        deliver_due(app, clock)
    assert replays.outcomes(replay_id) == {"succeeded": 0, "failed": 2, "waiting": 0, "held": 0, "sent": 2,
                                           "discarded": 0}


# -- who may replay what -----------------------------------------------------------------------
@pytest.fixture
def two_teams(app, client, producer, receiver, clock, users):
    acme_sub, acme_dead = make_dead(app, clock, producer, receiver, 400, ["file.updated"] * 2)
    other = Producer(client, "other")
    other_sub, other_dead = make_dead(app, clock, other, receiver, 400, ["file.updated"] * 2)
    return {"acme": (acme_sub, acme_dead), "other": (other_sub, other_dead), "other_team": other.team.id}


def _post_replay(client, auth, **form):
    return client.post("/dead-letters/replay", data={"csrf_token": auth.csrf("/dead-letters"), **form})


def test_an_owner_replays_only_its_own_team(app, client, auth, two_teams):
    acme_sub, acme_dead = two_teams["acme"]
    other_sub, other_dead = two_teams["other"]
    auth.login("owner")
    # "owner" owns acme; a filter naming the other team is refused outright.
    assert _post_replay(client, auth, team=str(two_teams["other_team"])).status_code == 403
    # Naming the other team's subscription matches nothing of it.
    resp = _post_replay(client, auth, subscription=other_sub)
    assert resp.status_code == 302
    run_worker(app)
    assert set(states(other_dead).values()) == {"dead"}
    # An unfiltered replay by the owner takes acme's dead letters and leaves the other team's alone.
    _post_replay(client, auth)
    run_worker(app)
    assert "dead" not in set(states(acme_dead).values())
    assert set(states(other_dead).values()) == {"dead"}


def test_an_operator_replays_across_teams(app, client, auth, two_teams):
    auth.login("operator")
    resp = _post_replay(client, auth, which="matching")
    assert resp.status_code == 302 and "/replays/" in resp.headers["Location"]
    run_worker(app)
    assert "dead" not in set(states({**two_teams["acme"][1], **two_teams["other"][1]}).values())


@pytest.mark.parametrize("role", ["oncall", "member"])
def test_roles_that_only_look_cannot_replay(app, client, auth, two_teams, role):
    auth.login(role)
    assert _post_replay(client, auth).status_code == 403
    acme_sub, acme_dead = two_teams["acme"]
    selected = _post_replay(client, auth, which="selected", delivery_id=list(acme_dead))
    assert selected.status_code == 403
    resp = client.post(f"/subscriptions/{acme_sub}/replays", data={"csrf_token": auth.csrf("/dead-letters")})
    assert resp.status_code == 403
    assert db.session.scalar(select(Replay.id)) is None
    assert set(states(acme_dead).values()) == {"dead"}


def test_replay_selected_takes_only_the_checked_ones(app, client, auth, two_teams):
    acme_sub, acme_dead = two_teams["acme"]
    chosen, left = sorted(acme_dead)
    auth.login("operator")
    resp = _post_replay(client, auth, which="selected", delivery_id=[chosen])
    assert resp.status_code == 302
    run_worker(app)
    assert states(acme_dead)[left] == "dead" and states(acme_dead)[chosen] == "scheduled"  # 400 again: retrying


def test_a_replay_that_cannot_reach_the_queue_says_so_instead_of_waiting_forever(app, producer, receiver, clock):
    import socket

    import redis

    sub, dead = make_dead(app, clock, producer, receiver, 400, ["file.updated"])
    with socket.socket() as probe:  # a port nothing listens on: Redis is down
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    working = app.extensions["promesa_redis"]
    app.extensions["promesa_redis"] = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
    try:
        replay, started = replays.start(replays.DeadLetterFilter(subscription_id=sub))
    finally:
        app.extensions["promesa_redis"] = working
    replay = db.session.get(Replay, replay.id)
    assert started and replay.state == "failed" and "queue" in replay.error
    assert set(states(dead).values()) == {"dead"}
    again, started_again = replays.start(replays.DeadLetterFilter(subscription_id=sub))
    assert started_again and again.id != replay.id  # the failed one does not block the filter
