"""Retention: what is kept, for how long, and the pruning (sweeper and `promesa prune`) that enforces it."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import func, select

from dashboard.cli import cli
from dashboard.core.extensions import db
from dashboard.models import Attempt, Check, CheckState, Delivery, Event, PortalLink
from dashboard.operations.retention import Pruner
from dashboard.operations.sweeper import sweep_once

from tests.support.pipeline import deliver_due


def count(model, *where) -> int:
    db.session.expire_all()
    return db.session.scalar(select(func.count()).select_from(model).where(*where))


def rows_of(event_id) -> tuple[int, int, int]:
    """(events, deliveries, attempts) still stored for one event."""
    deliveries = select(Delivery.id).where(Delivery.event_key.in_(select(Event.key).where(Event.id == event_id)))
    return (count(Event, Event.id == event_id), count(Delivery, Delivery.event_key.in_(select(Event.key).where(Event.id == event_id))),
            count(Attempt, Attempt.delivery_id.in_(deliveries)))


def dead_letter(app, clock, producer):
    accepted = producer.publish()
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(hours=1)
    return accepted


def test_succeeded_deliveries_their_attempts_and_events_go_after_the_retention(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/ok")
    old = producer.publish()
    deliver_due(app, clock)
    clock.advance(days=29)
    young = producer.publish()
    deliver_due(app, clock)
    assert rows_of(old["id"]) == (1, 1, 1)

    clock.advance(days=1, seconds=1)  # the first is now 30 days and a second past its success
    pruned = Pruner(app).prune()

    assert (pruned.deliveries, pruned.attempts, pruned.events) == (1, 1, 1)
    assert rows_of(old["id"]) == (0, 0, 0)
    assert rows_of(young["id"]) == (1, 1, 1)


def test_an_event_stays_while_one_of_its_deliveries_is_kept(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/ok")
    producer.subscribe(receiver.url + "/status/400")
    accepted = producer.publish()
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(hours=1)
    clock.advance(days=31)

    assert Pruner(app).prune().deliveries == 1  # the succeeded one; the dead letter is kept for 90 days
    events, deliveries, attempts = rows_of(accepted["id"])
    assert (events, deliveries, attempts) == (1, 1, 3)

    clock.advance(days=60)
    Pruner(app).prune()
    assert rows_of(accepted["id"]) == (0, 0, 0)


def test_dead_letters_are_kept_until_replayed_or_the_dead_retention(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/status/400")
    accepted = dead_letter(app, clock, producer)
    clock.advance(days=89)
    assert not Pruner(app).prune()
    assert rows_of(accepted["id"]) == (1, 1, 3)

    # A replay takes it out of the dead letters: the dead retention no longer applies to it.
    assert producer.post(f"/api/v1/subscriptions/{sub['id']}/replay").get_json() == {"replayed": 1}
    clock.advance(days=2)
    assert not Pruner(app).prune()
    assert count(Delivery, Delivery.event_key.in_(select(Event.key).where(Event.id == accepted["id"]))) == 1

    deliver_due(app, clock)
    for _ in range(3):
        clock.advance(hours=1)
        deliver_due(app, clock)
    assert count(Delivery, Delivery.event_key.in_(select(Event.key).where(Event.id == accepted["id"])), Delivery.state == "dead") == 1
    clock.advance(days=90, seconds=1)
    assert Pruner(app).prune().deliveries == 1
    assert rows_of(accepted["id"]) == (0, 0, 0)


def test_pending_held_and_scheduled_work_is_never_pruned(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/status/503")
    paused = producer.subscribe(receiver.url + "/ok")
    assert producer.post(f"/api/v1/subscriptions/{paused['id']}/pause").status_code == 200
    accepted = producer.publish()
    deliver_due(app, clock)  # the 503 is scheduled for a retry, the other is held
    clock.advance(days=365)
    assert not Pruner(app).prune()
    assert rows_of(accepted["id"])[:2] == (1, 2)


def test_events_no_subscription_wanted_go_after_the_retention(app, producer, clock):
    accepted = producer.publish("nobody.listens")
    assert accepted["deliveries"] == 0
    clock.advance(days=29)
    assert not Pruner(app).prune()
    clock.advance(days=1, seconds=1)
    assert Pruner(app).prune().events == 1
    assert count(Event, Event.id == accepted["id"]) == 0


def test_it_deletes_in_batches_of_the_configured_size(app, producer, receiver, clock):
    app.config["PROMESA_PRUNE_BATCH"] = 2
    producer.subscribe(receiver.url + "/ok")
    for _ in range(5):
        producer.publish()
    deliver_due(app, clock)
    clock.advance(days=31)

    bounded = Pruner(app).prune(max_batches=2)
    assert bounded.deliveries == 4 and count(Delivery) == 1  # bounded work: two batches of two
    assert Pruner(app).prune().deliveries == 1 and count(Delivery) == 0 and count(Event) == 0


def test_the_sweeper_prunes_a_bounded_amount_per_pass(app, producer, receiver, clock):
    app.config.update(PROMESA_PRUNE_BATCH=2, PROMESA_PRUNE_BATCHES_PER_PASS=1)
    producer.subscribe(receiver.url + "/ok")
    for _ in range(3):
        producer.publish()
    deliver_due(app, clock)
    clock.advance(days=30, seconds=1)

    sweep_once(app, clock)
    assert count(Delivery) == 1
    sweep_once(app, clock)
    assert count(Delivery) == 0 and count(Attempt) == 0 and count(Event) == 0


def test_retention_days_come_from_the_configuration(app, producer, receiver, clock):
    app.config.update(PROMESA_RETENTION_DAYS=7)
    producer.subscribe(receiver.url + "/ok")
    producer.publish()
    deliver_due(app, clock)
    clock.advance(days=7, seconds=1)
    assert Pruner(app).prune().deliveries == 1


def test_receiver_checks_go_after_the_retention_but_each_subscriptions_newest_stays(app, producer, receiver, clock):
    first, second = producer.subscribe(receiver.url + "/a"), producer.subscribe(receiver.url + "/b")
    now = clock.now()

    def check(n, sub, days_ago, state=CheckState.FINISHED):
        db.session.add(Check(id=f"chk_{n}", subscription_id=sub["id"], state=state, requested_by="test",
                             started_at=now - dt.timedelta(days=days_ago)))

    check(1, first, 40)
    check(2, first, 35)
    check(3, first, 1)  # first's newest
    check(4, second, 50)
    check(5, second, 45, CheckState.RUNNING)  # a running check is never pruned
    check(6, second, 31)  # second's newest: its page shows it, however old
    db.session.commit()

    pruned = Pruner(app).prune()

    assert pruned.checks == 3
    assert set(db.session.scalars(select(Check.id))) == {"chk_3", "chk_5", "chk_6"}


def test_portal_links_go_after_the_retention_once_expired(app, producer, clock):
    producer.put_consumer("cus_1")
    for expires_in in (60, 86400):
        assert producer.post("/api/v1/consumers/cus_1/portal-links", {"expires_in": expires_in}).status_code == 201
    clock.advance(days=30, seconds=120)  # the first expired 30 days ago and more; the second, 29 days ago
    assert Pruner(app).prune().portal_links == 1
    assert count(PortalLink) == 1


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_promesa_prune_says_what_it_pruned(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/ok")
    producer.publish()
    deliver_due(app, clock)
    clock.advance(days=31)
    result = app.test_cli_runner().invoke(cli, ["prune"])
    assert result.exit_code == 0, result.output
    assert "pruned 1 deliveries, 1 attempts, 1 events, 0 receiver checks and 0 portal links" in result.output
    assert "succeeded 30 days, dead letters 90 days" in result.output
    assert count(Delivery) == 0


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_overview_says_what_is_kept(app, client, auth, users):
    app.config.update(PROMESA_RETENTION_DAYS=14, PROMESA_DEAD_RETENTION_DAYS=60)
    auth.login("member")
    page = client.get("/").get_data(as_text=True)
    assert "succeeded deliveries and their attempts for 14 days" in page
    assert "dead letters until replayed, or for 60 days" in page


def test_events_addressed_to_a_consumer_go_as_others_do_and_the_consumer_stays(app, producer, receiver, clock):
    """Issue 37: a consumer's events, delivered or not yet routed anywhere (it had no endpoint), are pruned on the
    same schedule as the team's own; the consumer, its endpoint and its routing stay."""
    producer.put_consumer("alice")
    producer.put_consumer("bob")  # no endpoint yet: its event is kept with no delivery
    alices = producer.subscribe(receiver.url + "/ok/alice", consumer="alice")
    to_alice = producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": "alice"}).get_json()
    to_bob = producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": "bob"}).get_json()
    assert (to_alice["deliveries"], to_bob["deliveries"]) == (1, 0)
    deliver_due(app, clock)
    clock.advance(days=29)
    assert not Pruner(app).prune()  # within the retention: both kept (a "replay since" can still reach bob's)
    assert rows_of(to_alice["id"]) == (1, 1, 1) and rows_of(to_bob["id"]) == (1, 0, 0)

    clock.advance(days=1, seconds=1)
    pruned = Pruner(app).prune()
    assert (pruned.deliveries, pruned.attempts, pruned.events) == (1, 1, 2)
    assert rows_of(to_alice["id"]) == (0, 0, 0) and rows_of(to_bob["id"]) == (0, 0, 0)
    for uid, endpoints in (("alice", 1), ("bob", 0)):
        kept = producer.get(f"/api/v1/consumers/{uid}").get_json()
        assert (kept["uid"], kept["state"], kept["subscriptions"], kept["deleted_at"]) == (uid, "active", endpoints, None)
    again = producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": "alice"}).get_json()
    assert again["deliveries"] == 1
    deliver_due(app, clock)
    assert receiver.count("/ok/alice") == 2 and rows_of(again["id"]) == (1, 1, 1)
    assert alices["consumer"] == "alice"
