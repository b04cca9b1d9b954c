"""Incident rules, evaluated by the sweeper on the injected clock: one incident per cause, and it
resolves by itself once its rule has been false for a whole window."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Incident, IncidentState
from dashboard.operations.sweeper import sweep_once

from tests.support.pipeline import deliver_due


def _incidents(rule=None):
    db.session.expire_all()
    query = select(Incident).order_by(Incident.opened_at)
    if rule:
        query = query.where(Incident.rule == rule)
    return db.session.scalars(query).all()


def _fail_to_dead(app, clock, rounds=3):
    """A 4xx receiver: each delivery dies after its third attempt (about 2.5 minutes in)."""
    for _ in range(rounds):
        deliver_due(app, clock)
        clock.advance(minutes=2)


def test_dead_letters_open_one_incident_that_resolves_after_a_quiet_window(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/status/400")
    for _ in range(5):
        producer.publish()
    _fail_to_dead(app, clock)
    sweep_once(app)
    [incident] = _incidents()
    assert (incident.rule, incident.state, incident.subscription_id) == ("dead_letters", "open", sub["id"])
    assert incident.figures["dead"] == 5 and incident.figures["threshold"] == 5
    assert incident.first_seen_at <= incident.opened_at == clock.now()

    clock.advance(minutes=1)
    sweep_once(app)  # still true: the same incident, seen again; no second one
    [again] = _incidents()
    assert again.id == incident.id and again.last_seen_at == clock.now()

    clock.advance(minutes=14)
    sweep_once(app)  # 14 quiet minutes since last seen: not yet a whole window
    assert _incidents()[0].state == "open"
    clock.advance(minutes=2)
    sweep_once(app)
    [resolved] = _incidents()
    assert resolved.state == "resolved" and resolved.resolved_at == clock.now()
    actions = db.session.scalars(select(AuditEntry.action).where(AuditEntry.actor_kind == "system")).all()
    assert actions.count("incident.opened") == 1 and actions.count("incident.resolved") == 1


def test_failure_rate_needs_enough_attempts(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/status/500")
    for _ in range(19):
        producer.publish()
    deliver_due(app, clock)
    sweep_once(app)
    assert _incidents() == []  # 19 failed attempts: below the 20 the rule asks for
    producer.publish()
    deliver_due(app, clock)
    sweep_once(app)
    [incident] = _incidents()
    assert incident.rule == "failure_rate"
    assert incident.figures["failed_percent"] == 100.0 and incident.figures["attempts"] == 20


def test_failing_since_fires_after_an_hour_without_success(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/status/500", retry_policy="quick-then-sweep")
    producer.publish()
    for _ in range(6):  # 0 to 50 minutes of failing
        deliver_due(app, clock)
        sweep_once(app)
        assert not _incidents("failing_since")
        clock.advance(minutes=10)
    for _ in range(3):  # the streak is folded a couple of minutes behind
        deliver_due(app, clock)
        sweep_once(app)
        clock.advance(minutes=1)
    [incident] = _incidents("failing_since")
    assert incident.state == "open" and incident.figures["window_minutes"] == 60
    assert clock.now() - incident.first_seen_at >= dt.timedelta(minutes=60)


def test_backlog_is_promesas_own_health(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/ok")
    producer.publish()
    clock.advance(minutes=11)  # nobody delivered it: it has waited 11 minutes
    sweep_once(app)
    [incident] = _incidents()
    assert (incident.rule, incident.subscription_id, incident.team_id) == ("backlog", None, None)
    assert incident.figures["due"] == 1 and incident.figures["oldest_waited_minutes"] == 11.0
    deliver_due(app, clock)
    clock.advance(minutes=10)
    sweep_once(app)
    assert _incidents()[0].state == "resolved"


def test_the_database_refuses_a_second_unresolved_incident(app, clock):
    now = clock.now()

    def add(sub, rule, resolved=False):
        db.session.add(Incident(subscription_id=sub, rule=rule, state="resolved" if resolved else "open",
                                opened_at=now, first_seen_at=now, last_seen_at=now, figures={},
                                resolved_at=now if resolved else None))
        db.session.commit()

    add("sub_a", "dead_letters", resolved=True)
    add("sub_a", "dead_letters")  # a resolved one does not count
    add("sub_b", "failure_rate")
    add(None, "backlog")
    # One outage of one subscription is one incident, whichever rule fires.
    for sub, rule in [("sub_a", "dead_letters"), ("sub_a", "failure_rate"), (None, "backlog")]:
        with pytest.raises(IntegrityError):
            add(sub, rule)
        db.session.rollback()
    assert len(_incidents()) == 4


def test_acknowledge_is_once_and_recorded(app, producer, receiver, clock, users):
    from dashboard.operations import incidents

    producer.subscribe(receiver.url + "/status/400")
    for _ in range(5):
        producer.publish()
    _fail_to_dead(app, clock)
    sweep_once(app)
    [incident] = _incidents()
    assert incidents.acknowledge(incident, "oncall@example.com") == 0  # no sink to tell
    assert incidents.acknowledge(incident, "admin@example.com") is None
    [incident] = _incidents()
    assert (incident.state, incident.acknowledged_by) == (IncidentState.ACKNOWLEDGED, "oncall@example.com")


def test_the_backlog_opens_while_redis_is_down(app, producer, receiver, clock, config):
    import redis

    from dashboard.app import create_app

    producer.subscribe(receiver.url + "/ok")
    producer.publish()
    clock.advance(minutes=11)
    cut_off = create_app({**config, "REDIS_URL": "redis://127.0.0.1:1"})  # nothing listens there
    with pytest.raises(redis.ConnectionError):
        sweep_once(cut_off)  # the Redis part of the pass fails, loudly...
    [incident] = _incidents()  # ...after the rules were evaluated
    assert incident.rule == "backlog"
