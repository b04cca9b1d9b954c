"""Replays and discards in the repairs lane (issue 35): their jobs never go to the delivery workers'
queue, and one job of a team runs at a time; the team's next waits queued and starts when it ends."""

from __future__ import annotations

from sqlalchemy import select, update

from dashboard.core.extensions import db
from dashboard.models import Delivery, Replay
from dashboard.operations import replays
from dashboard.queue import lanes
from dashboard.queue.work import WorkQueue
from tests.operations.test_replays import make_dead, run_worker


def state(replay_id: str) -> str:
    db.session.expire_all()
    return db.session.get(Replay, replay_id).state


def test_one_job_of_a_team_runs_at_a_time_and_the_next_starts_when_it_ends(app, producer, receiver, clock):
    sub, dead = make_dead(app, clock, producer, receiver, 400, ["file.updated", "order.paid", "order.paid"])
    first, _ = replays.start(replays.DeadLetterFilter(subscription_id=sub, event_types=("file.updated",)))
    second, _ = replays.start(replays.DeadLetterFilter(subscription_id=sub, event_types=("order.paid",)), "discard")
    first_id, second_id = first.id, second.id
    repairs = lanes.queue("repairs", app)
    assert repairs.job_ids == [f"replay-{first_id}", f"replay-{second_id}"]
    assert not [job for job in WorkQueue.for_app(app).rq.job_ids if job.startswith("replay-")]  # none for deliverers
    # A worker holds the first (running); the second's job finds its team busy and leaves it queued.
    repairs.remove(f"replay-{first_id}")
    db.session.execute(update(Replay).where(Replay.id == first_id).values(state="running", started_at=clock.now()))
    db.session.commit()
    run_worker(app)
    assert state(second_id) == "queued"
    assert set(db.session.scalars(select(Delivery.state).where(Delivery.id.in_(list(dead))))) == {"dead"}

    assert replays.cancel(db.session.get(Replay, first_id))  # it ends: the team's next starts
    assert repairs.job_ids == [f"replay-{second_id}"]
    run_worker(app)
    assert state(second_id) == "finished"
    discarded = db.session.scalars(select(Delivery.state).join(Delivery.event)
                                   .where(Delivery.id.in_(list(dead)))).all()
    assert sorted(discarded) == ["dead", "discarded", "discarded"]
