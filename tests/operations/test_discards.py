"""Discards as jobs, giving up on hopeless schedules, and replays of a paused subscription that say their
deliveries are held (SQLite and PostgreSQL, real Redis, real RQ worker, real receiver)."""

from __future__ import annotations

import datetime as dt
import json

from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Delivery, Event, Replay, Subscription
from dashboard.operations import replays
from dashboard.operations.retention import Pruner
from dashboard.stats import outcomes
from dashboard.web.api import shapes
from dashboard.subscriptions import service as subscription_service

from tests.operations.test_replays import _small_chunks, fix_receiver, make_dead, run_worker  # noqa: F401
from tests.support.pipeline import deliver_due


def states(sub_id) -> list[str]:
    db.session.expire_all()
    return sorted(db.session.scalars(select(Delivery.state).where(Delivery.subscription_id == sub_id)))


def test_a_discard_job_ends_the_matching_dead_letters_discarded_in_chunks(app, producer, receiver, clock):
    sub, dead = make_dead(app, clock, producer, receiver, 400, ["file.updated"] * 3 + ["order.paid"] * 2)
    job, started = replays.start(replays.DeadLetterFilter(subscription_id=sub, event_types=("file.updated",)),
                                 "discard")
    assert started and job.kind == "discard" and job.total == 3
    same, again = replays.start(replays.DeadLetterFilter(subscription_id=sub, event_types=("file.updated",)),
                                "discard")
    assert same.id == job.id and not again  # a second click finds the running one
    replay, replay_started = replays.start(replays.DeadLetterFilter(subscription_id=sub,
                                                                    event_types=("file.updated",)))
    assert replay_started and replay.id != job.id  # a replay of the same filter is another job
    replays.cancel(replay)
    job_id = job.id
    run_worker(app)
    assert states(sub) == ["dead", "dead", "discarded", "discarded", "discarded"]
    job = db.session.get(Replay, job_id)
    assert (job.state, job.done) == ("finished", 3)
    assert shapes.replay(job)["discarded"] == 3 and shapes.replay(job)["progress"] == "finished"
    entries = db.session.execute(select(AuditEntry.action, AuditEntry.deliveries, AuditEntry.detail)
                                 .where(AuditEntry.target == f"replay:{job_id}").order_by(AuditEntry.id)).all()
    assert [(a, n) for a, n, _ in entries] == [("discard.started", 3), ("discard.finished", 3)]
    assert entries[-1].detail == {"total": 3, "discarded": 3}
    # Never sent again: a replay of every dead letter leaves them alone, and the engine never picks them up.
    fix_receiver(sub, receiver)
    before = len(receiver.requests)
    assert subscription_service.replay(db.session.get(Subscription, sub)) == 2
    deliver_due(app, clock)
    assert len(receiver.requests) - before == 2
    assert states(sub) == ["discarded"] * 3 + ["succeeded"] * 2
    # No notification about a discard's end: that is for replays.
    assert db.session.scalar(select(Event).where(Event.type == "promesa.replay.finished")) is None


def test_discarded_deliveries_stay_readable_until_the_dead_retention(app, producer, receiver, clock):
    sub, dead = make_dead(app, clock, producer, receiver, 400, ["file.updated"])
    replays.start(replays.DeadLetterFilter(subscription_id=sub), "discard")
    run_worker(app)
    clock.advance(days=89)
    assert not Pruner(app).prune()
    assert states(sub) == ["discarded"]
    clock.advance(days=2)
    assert Pruner(app).prune().deliveries == 1 and states(sub) == []


def test_giving_up_makes_scheduled_deliveries_dead_at_once_and_leaves_the_rest(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/status/503")
    ok = producer.subscribe(receiver.url + "/ok")
    for _ in range(2):
        producer.publish()
    deliver_due(app, clock)
    assert states(sub["id"]) == ["scheduled", "scheduled"] and states(ok["id"]) == ["succeeded"] * 2
    one = db.session.scalar(select(Delivery.id).where(Delivery.subscription_id == sub["id"]))
    row = db.session.get(Subscription, sub["id"])
    assert subscription_service.give_up(row, [one]) == 1
    assert states(sub["id"]) == ["dead", "scheduled"]
    assert subscription_service.give_up(row) == 1
    assert states(sub["id"]) == ["dead", "dead"] and states(ok["id"]) == ["succeeded"] * 2
    # Counted as dead letters, as a schedule that ran out would be: the charts, /metrics and the rules see them.
    counted = outcomes.totals(db.session, [sub["id"], ok["id"]], clock.now() - dt.timedelta(hours=1))
    assert (counted[sub["id"]].dead, counted[sub["id"]].failed, counted[ok["id"]].dead) == (2, 2, 0)
    clock.advance(days=2)
    before = len(receiver.requests)
    deliver_due(app, clock)  # their retries were due by now: none is sent
    assert len(receiver.requests) == before
    counts = db.session.scalars(select(AuditEntry.deliveries).where(AuditEntry.action == "deliveries.given_up")
                                .order_by(AuditEntry.id)).all()
    assert counts == [1, 1]


def test_a_replay_while_paused_says_held_until_resume_and_finishes_when_sent(app, producer, receiver, clock):
    from dashboard.operations import notifications

    sub, dead = make_dead(app, clock, producer, receiver, 400, ["file.updated"] * 3)
    notifications.add_sink("slack", receiver.url + "/ok")
    subscription_service.pause(db.session.get(Subscription, sub), "vendor outage")
    fix_receiver(sub, receiver)
    replay, _ = replays.start(replays.DeadLetterFilter(subscription_id=sub))
    replay_id = replay.id
    run_worker(app)
    replay = db.session.get(Replay, replay_id)
    described = shapes.replay(replay)
    assert (described["state"], described["progress"]) == ("finished", "held until resume")
    assert (described["held"], described["sent"], described["waiting"]) == (3, 0, 0)
    [told] = db.session.scalars(select(Event).where(Event.type == "promesa.replay.finished")).all()
    text = json.loads(told.body)["text"]
    assert told.data["held"] == 3 and told.data["sent"] == 0
    assert "3 held until the subscription resumes, 0 sent so far" in text and "finished" not in text
    finished = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "replay.finished"))
    assert finished.detail["held"] == 3

    subscription_service.resume(db.session.get(Subscription, sub))
    described = shapes.replay(db.session.get(Replay, replay_id))
    assert (described["progress"], described["held"], described["waiting"]) == ("sending", 0, 3)
    deliver_due(app, clock)
    described = shapes.replay(db.session.get(Replay, replay_id))
    assert (described["progress"], described["sent"], described["succeeded"]) == ("finished", 3, 3)


def test_the_notification_only_says_finished_once_all_was_delivered(app, producer, receiver):
    from dashboard.operations import notifications

    notifications.add_sink("slack", receiver.url + "/ok")
    notifications.replay_finished(subscription_id="sub_x", team_id=1, replayed=4, sent=1)
    notifications.replay_finished(subscription_id="sub_x", team_id=1, replayed=4, delivered=4)
    db.session.commit()
    texts = [json.loads(e.body)["text"] for e in
             db.session.scalars(select(Event).where(Event.type == "promesa.replay.finished").order_by(Event.key))]
    assert sorted(t.split(" <")[0] for t in texts) == [
        "Replay of 4 deliveries finished, 4 delivered.", "Replay of 4 deliveries re-queued: on their way, 1 sent so far."]
