"""Ingest's kept routing (PostgreSQL): a repeated single-event request writes without reading, and any
committed change to what routes an event, made from anywhere (another process, plain SQL), takes effect
for the very next write, as it did when every request read."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy import select

from dashboard.ingest import autocommit
from dashboard.core.extensions import db
from dashboard.models import Delivery, Event
from dashboard.ingest.routing_cache import RoutingCache

from tests.ingest.test_autocommit import fresh_request, statements  # noqa: F401 - a fixture


@pytest.fixture
def elsewhere(database_url):
    """Plain SQL on a connection of its own, committed: as another process or a person at psql would."""
    if not database_url.startswith("postgresql"):
        pytest.skip("routing is kept on PostgreSQL only")
    engine = sa.create_engine(database_url)

    def run(sql: str, **params):
        with engine.begin() as conn:
            return conn.execute(sa.text(sql), params)

    yield run
    engine.dispose()


def generation(run) -> int:
    return run("SELECT generation FROM promesa_routing_generation").scalar_one()


def deliveries_of(event_id: str) -> list[Delivery]:
    db.session.expire_all()
    return db.session.scalars(select(Delivery).join(Event, Event.key == Delivery.event_key)
                              .where(Event.id == event_id)).all()


def test_a_repeated_request_writes_without_reading(app, producer, receiver, elsewhere, statements):
    producer.subscribe(receiver.url + "/ok")
    fresh_request(producer)
    statements.clear()
    accepted = fresh_request(producer)
    assert [verb for verb, _ in statements] == ["WITH"], statements  # no routing read: it was kept
    assert len(deliveries_of(accepted["id"])) == 1


def test_a_subscription_added_elsewhere_gets_the_very_next_event(app, producer, receiver, elsewhere, statements):
    first = producer.subscribe(receiver.url + "/ok")
    fresh_request(producer)
    elsewhere("INSERT INTO subscriptions (id, team_id, url, description, event_types, retry_policy, signature_scheme, "
              "state, secret_ciphertext, connect_timeout, attempt_timeout, max_age_seconds, created_at, updated_at) "
              "SELECT 'sub_added_elsewhere', team_id, url, description, event_types, retry_policy, signature_scheme, "
              "state, secret_ciphertext, connect_timeout, attempt_timeout, max_age_seconds, created_at, updated_at "
              "FROM subscriptions WHERE id = :id", id=first["id"])
    statements.clear()
    accepted = fresh_request(producer)
    # The kept routing's write stored nothing; the request read again and wrote again.
    assert [verb for verb, _ in statements] == ["WITH", "SELECT", "WITH"], statements
    assert sorted(d.subscription_id for d in deliveries_of(accepted["id"])) == sorted([first["id"], "sub_added_elsewhere"])
    assert db.session.scalar(select(sa.func.count()).select_from(Event)) == 2  # stored once, not twice


def test_a_batch_from_what_was_kept_is_written_whole_or_read_again(app, producer, receiver, elsewhere, statements):
    """A batch of one type takes the kept routing too: its events and deliveries (arrays, unnest) are written
    under the same condition, so a change stores none of them, and the batch is read and written again."""
    first = producer.subscribe(receiver.url + "/ok")

    def batch(*ids):
        db.session.remove()
        resp = producer.post("/api/v1/events/batch", {"events": [{"type": "file.updated", "id": i} for i in ids]})
        assert resp.status_code == 202, resp.get_json()

    batch("b1", "b2")
    statements.clear()
    batch("b3", "b4")
    # (the batch endpoint's token check and its look for stored ids are the session's, not in autocommit)
    assert ("SELECT", True) not in statements and ("WITH", True) in statements, statements  # no routing read
    elsewhere("UPDATE subscriptions SET event_types = '[\"file.*\"]' WHERE id = :id", id=first["id"])
    elsewhere("INSERT INTO subscriptions (id, team_id, url, description, event_types, retry_policy, signature_scheme, "
              "state, secret_ciphertext, connect_timeout, attempt_timeout, max_age_seconds, created_at, updated_at) "
              "SELECT 'sub_added_elsewhere', team_id, url, description, event_types, retry_policy, signature_scheme, "
              "state, secret_ciphertext, connect_timeout, attempt_timeout, max_age_seconds, created_at, updated_at "
              "FROM subscriptions WHERE id = :id", id=first["id"])
    batch("b5", "b6")
    for event_id in ("b5", "b6"):
        assert sorted(d.subscription_id for d in deliveries_of(event_id)) == sorted([first["id"], "sub_added_elsewhere"])
    assert db.session.scalar(select(sa.func.count()).select_from(Event)) == 6


def test_a_token_revoked_elsewhere_is_refused_at_once(app, producer, receiver, elsewhere):
    producer.subscribe(receiver.url + "/ok")
    fresh_request(producer)
    elsewhere("UPDATE api_tokens SET revoked_at = now()")
    db.session.remove()
    resp = producer.post("/api/v1/events", {"type": "file.updated", "data": {}})
    assert resp.status_code == 401, resp.get_json()
    assert db.session.scalar(select(sa.func.count()).select_from(Event)) == 1


def test_a_revoked_token_sending_only_a_duplicate_is_refused_too(app, producer, receiver, elsewhere):
    """Nothing is written for a duplicate, so no write checks the kept routing: it is read again."""
    producer.subscribe(receiver.url + "/ok")
    db.session.remove()
    producer.post("/api/v1/events", {"id": "evt_once", "type": "file.updated", "data": {}})
    elsewhere("UPDATE api_tokens SET revoked_at = now()")
    db.session.remove()
    resp = producer.post("/api/v1/events", {"id": "evt_once", "type": "file.updated", "data": {}})
    assert resp.status_code == 401, resp.get_json()


def test_a_subscription_paused_elsewhere_holds_the_next_delivery(app, producer, receiver, elsewhere):
    sub = producer.subscribe(receiver.url + "/ok")
    fresh_request(producer)
    elsewhere("UPDATE subscriptions SET state = 'paused' WHERE id = :id", id=sub["id"])
    accepted = fresh_request(producer)
    assert [d.state for d in deliveries_of(accepted["id"])] == ["held"]


def test_a_refusal_is_never_given_from_what_was_kept(app, producer, receiver, elsewhere):
    """The kept declaration requires a field; a newer version, published elsewhere, does not. The write would
    have caught the change, but a refusal comes before any write: it is read again instead."""
    producer.subscribe(receiver.url + "/ok")
    required = {"type": "object", "required": ["size"]}
    assert producer.post("/api/v1/event-types", {"name": "file.updated", "version": 1, "schema": required}).status_code == 201
    fresh_request(producer, data={"size": 1})
    elsewhere("INSERT INTO event_types (team_id, name, version, description, schema, created_at) "
              "SELECT team_id, name, 2, '', '{\"type\": \"object\"}', now() FROM event_types WHERE version = 1")
    accepted = fresh_request(producer, data={"no": "size"})
    assert db.session.scalar(select(Event.version).where(Event.id == accepted["id"])) == 2


def test_the_generation_moves_once_per_committed_change_and_never_for_a_rolled_back_one(app, producer, elsewhere):
    before = generation(elsewhere)
    elsewhere("UPDATE teams SET strict_event_types = strict_event_types")
    elsewhere("UPDATE api_tokens SET display_prefix = display_prefix; UPDATE teams SET name = name")
    assert generation(elsewhere) == before + 2  # one per transaction, however many rows and tables
    with pytest.raises(sa.exc.DBAPIError):
        elsewhere("UPDATE teams SET name = name; SELECT 1/0")
    assert generation(elsewhere) == before + 2
    elsewhere("TRUNCATE event_types")
    assert generation(elsewhere) == before + 3


def test_other_writes_do_not_move_it(app, producer, receiver, elsewhere):
    producer.subscribe(receiver.url + "/ok")
    before = generation(elsewhere)
    fresh_request(producer)
    elsewhere("UPDATE deliveries SET updated_at = now()")
    assert generation(elsewhere) == before


def test_the_cache_keeps_one_generation_and_a_bounded_number_of_answers():
    cache = RoutingCache(max_entries=2)
    cache.put("a", 1, generation=10)
    cache.put("b", 2, generation=10)
    assert cache.get("a") == (1, 10)  # now the most recently used
    cache.put("c", 3, generation=10)
    assert cache.get("b") is None and len(cache) == 2  # the least recently used went
    cache.put("d", 4, generation=9)  # read before a change this process has already seen: not kept
    assert cache.get("d") is None and cache.get("a") == (1, 10)
    cache.put("e", 5, generation=11)  # a newer generation: everything older is stale
    assert cache.get("a") is None and cache.get("e") == (5, 11)
    cache.forget(11)
    assert len(cache) == 0


def test_nothing_is_kept_outside_ingest_own_path(app, producer, receiver, database_url):
    """SQLite, or a caller holding a transaction: every request reads."""
    producer.subscribe(receiver.url + "/ok")
    producer.publish()  # the test client's session is in a transaction here: not ingest's autocommit path
    if database_url.startswith("postgresql"):
        with app.test_request_context():
            assert len(autocommit.routing_cache()) == 0
    else:
        assert "promesa.routing_cache" not in app.extensions


def fresh_addressed(producer, uid: str):
    db.session.remove()
    resp = producer.post("/api/v1/events", {"type": "file.updated", "consumer": uid, "data": {"resource_id": "f_1"}})
    return resp.status_code, resp.get_json()


def test_an_addressed_request_is_kept_per_consumer(app, producer, receiver, elsewhere, statements):
    for uid in ("cus_a", "cus_b"):
        producer.put_consumer(uid)
        producer.subscribe(receiver.url + "/ok/" + uid, consumer=uid)
    fresh_addressed(producer, "cus_a")
    statements.clear()
    status, accepted = fresh_addressed(producer, "cus_a")
    assert status == 202 and [verb for verb, _ in statements] == ["WITH"], statements
    assert [d.subscription.url for d in deliveries_of(accepted["id"])] == [receiver.url + "/ok/cus_a"]
    statements.clear()
    status, accepted = fresh_addressed(producer, "cus_b")  # another consumer: its own read
    assert [verb for verb, _ in statements] == ["SELECT", "WITH"], statements
    assert [d.subscription.url for d in deliveries_of(accepted["id"])] == [receiver.url + "/ok/cus_b"]


def test_a_consumer_disabled_elsewhere_holds_the_very_next_event(app, producer, receiver, elsewhere):
    producer.put_consumer("cus_a")
    producer.subscribe(receiver.url + "/ok", consumer="cus_a")
    fresh_addressed(producer, "cus_a")
    before = generation(elsewhere)
    elsewhere("UPDATE consumers SET state = 'disabled' WHERE uid = 'cus_a'")
    assert generation(elsewhere) != before
    status, accepted = fresh_addressed(producer, "cus_a")
    assert status == 202 and [d.state for d in deliveries_of(accepted["id"])] == ["held"]


def test_a_uid_refused_once_is_read_again_once_the_consumer_exists(app, producer, receiver, elsewhere):
    producer.subscribe(receiver.url + "/ok")
    status, _ = fresh_addressed(producer, "cus_late")
    assert status == 422
    producer.put_consumer("cus_late")
    producer.subscribe(receiver.url + "/ok/late", consumer="cus_late")
    status, accepted = fresh_addressed(producer, "cus_late")
    assert status == 202 and accepted["deliveries"] == 1
