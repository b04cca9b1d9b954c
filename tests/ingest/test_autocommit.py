"""The one-event request's database path: on PostgreSQL one write statement, outside a transaction."""

from __future__ import annotations

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from dashboard.ingest import autocommit
from dashboard.core.extensions import db
from dashboard.models import Delivery, Event


@pytest.fixture
def statements(app, monkeypatch):
    """Every statement the app sends, with whether its connection was in autocommit: on PostgreSQL as psycopg
    is asked to send it (ingest runs some on the driver's cursor itself), on SQLite as SQLAlchemy sends it."""
    seen = []
    if db.engine.dialect.name == "postgresql":
        import psycopg

        real_execute = psycopg.Cursor.execute

        def execute(cursor, query, *args, **kwargs):
            if isinstance(query, (str, bytes)):  # (psycopg's own type lookups, on a new connection, are Composed)
                text = query if isinstance(query, str) else query.decode()
                seen.append((text.split(None, 1)[0].upper(), cursor.connection.autocommit))
            return real_execute(cursor, query, *args, **kwargs)

        autocommit.engine().raw_connection().close()  # connected (and its dialect's set-up queries) beforehand
        monkeypatch.setattr(psycopg.Cursor, "execute", execute)
        yield seen
        return

    def record(conn, cursor, statement, parameters, context, executemany):
        seen.append((statement.split(None, 1)[0].upper(), False))

    event.listen(db.engine, "before_cursor_execute", record)
    yield seen
    event.remove(db.engine, "before_cursor_execute", record)


def fresh_request(producer, *args, **kwargs):
    """As under gunicorn: the request starts with no session of its own yet."""
    db.session.remove()
    return producer.publish(*args, **kwargs)


def test_an_event_and_its_deliveries_are_stored_by_one_write(app, producer, receiver, statements):
    producer.subscribe(receiver.url + "/ok")
    producer.subscribe(receiver.url + "/ok")
    statements.clear()
    accepted = fresh_request(producer)

    writes = [(verb, autocommit) for verb, autocommit in statements if verb in ("INSERT", "WITH")]
    if db.engine.dialect.name == "postgresql":
        assert writes == [("WITH", True)]  # events and deliveries in one statement, its own transaction
    else:
        assert [verb for verb, _ in writes] == ["INSERT", "INSERT"]
    assert accepted["deliveries"] == 2
    assert db.session.scalar(select(func.count()).select_from(Delivery).where(Delivery.event_key.in_(select(Event.key).where(Event.id == accepted["id"])))) == 2
    assert db.session.get(Event, accepted["id"]) is not None


def test_a_single_event_request_takes_no_orm_session_on_postgresql(app, producer, receiver, database_url, statements):
    """Two Core statements need no session around them: taking the session's connection, switching it to
    autocommit and committing it were a fifth of the request's CPU."""
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite keeps the session's transaction")
    producer.subscribe(receiver.url + "/ok")
    begun = []

    def session_began(session, transaction, connection):
        begun.append(connection)

    event.listen(Session, "after_begin", session_began)
    try:
        statements.clear()
        accepted = fresh_request(producer)
    finally:
        event.remove(Session, "after_begin", session_began)
    assert accepted["deliveries"] == 1
    assert begun == []
    assert statements == [("SELECT", True), ("WITH", True)]  # the token and routing read, then the write


def test_a_repeated_key_still_answers_with_the_first_event(app, producer, receiver):
    producer.subscribe(receiver.url + "/ok")
    first = fresh_request(producer, headers={"Idempotency-Key": "order-1"})
    again = fresh_request(producer, headers={"Idempotency-Key": "order-1"})
    assert again == {"id": first["id"], "deliveries": 1, "duplicate": True}


def test_the_connection_goes_back_to_the_pool_with_transactions(app, producer, receiver):
    producer.subscribe(receiver.url + "/ok")
    fresh_request(producer)
    db.session.remove()
    with db.engine.connect() as conn:
        assert not getattr(conn.connection.dbapi_connection, "autocommit", False)


def test_routing_reads_only_subscriptions_that_can_want_the_type_and_misses_none(app, producer, receiver):
    wanted = [producer.subscribe(receiver.url + "/ok", event_types=types)["id"]
              for types in (["a_b"], ["a*"], ["*"], ["x.y", "a_b"], ["a_*"])]
    for types in (["axb"], ["a_bc"], ["x.y"], ["b*"]):  # '_' is no wildcard here, whatever LIKE thinks
        producer.subscribe(receiver.url + "/ok", event_types=types)
    gone = producer.subscribe(receiver.url + "/ok", event_types=["a_b"])
    assert producer.client.delete(f"/api/v1/subscriptions/{gone['id']}", headers=producer.headers()).status_code == 200
    changed = producer.subscribe(receiver.url + "/ok", event_types=["x.y"])  # its keys follow an edit
    assert producer.client.patch(f"/api/v1/subscriptions/{changed['id']}", json={"event_types": ["a_b"]},
                                 headers=producer.headers()).status_code == 200
    wanted.append(changed["id"])
    accepted = fresh_request(producer, "a_b")
    got = db.session.scalars(select(Delivery.subscription_id).where(Delivery.event_key.in_(select(Event.key).where(Event.id == accepted["id"])))).all()
    assert sorted(got) == sorted(wanted)


@pytest.mark.postgres
@pytest.mark.planner
def test_on_postgresql_routing_finds_its_subscriptions_by_the_route_keys_index(app, producer, receiver,
                                                                                database_url):
    """A team's read of one type must not grow with the team's subscriptions: the statement's condition is
    the index's expression, so the planner can read just the keys "<team> <type>" and "<team> *"."""
    if not database_url.startswith("postgresql"):
        pytest.skip("a PostgreSQL planner question")
    from sqlalchemy.dialects import postgresql

    from dashboard.ingest import accept as ingest

    for n in range(30):
        producer.subscribe(receiver.url + "/ok", event_types=[f"type.{n}"])
    # ... nor with its consumers' subscriptions: an addressed read finds the consumer's alone, by the same index.
    for n in range(3):
        producer.put_consumer(f"c-{n}")
        for t in range(10):
            producer.subscribe(receiver.url + "/ok", event_types=[f"type.{t}"], consumer=f"c-{n}")
    connection = db.session.connection()
    connection.exec_driver_sql("ANALYZE subscriptions")
    connection.exec_driver_sql("SET LOCAL enable_seqscan = off")  # a table this small would be read whole
    team = {"team_id": producer.team.id}
    for statement, params in ((ingest._ROUTING_ONE_TYPE[True], team),
                              (ingest._ROUTED_AND_DECLARED[False, False, True, False], team),
                              (ingest._ROUTED_AND_DECLARED[False, False, True, True], team | {"consumer": "c-1"})):
        compiled = statement.compile(dialect=postgresql.dialect())
        values = compiled.params | params | {"name": "type.7"}
        plan = "\n".join(connection.exec_driver_sql("EXPLAIN (ANALYZE, COSTS OFF) " + compiled.string, values).scalars())
        assert "ix_subscriptions_route_keys" in plan and "ix_subscriptions_team_id" not in plan, plan
        assert "promesa_route_keys" not in plan, plan  # the stored keys are read; nothing computes them per read
        assert "Rows Removed by" not in plan, plan  # nothing read and thrown away
    definition = connection.exec_driver_sql(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_subscriptions_route_keys'").scalar_one()
    db.session.rollback()
    # Without it, new subscriptions wait in GIN's pending list, which every read goes through until a VACUUM.
    assert "fastupdate=off" in definition, definition


def test_a_single_event_is_two_statements_its_token_routing_and_declaration_then_the_write(
        app, producer, receiver, statements):
    """The token, the routing and the catalog's declaration of the event's type are one read (they were three)."""
    producer.subscribe(receiver.url + "/ok")
    producer.post("/api/v1/event-types", {"name": "file.updated", "version": 2, "schema": {"type": "object"}})
    statements.clear()
    accepted = fresh_request(producer)
    verbs = [verb for verb, _ in statements]
    if db.engine.dialect.name == "postgresql":
        assert verbs == ["SELECT", "WITH"], statements
    else:
        assert verbs == ["SELECT", "INSERT", "INSERT"], statements
    assert db.session.get(Event, accepted["id"]).version == 2  # the latest declared version, read with the routing


@pytest.mark.parametrize("rows", [1, 3])
def test_one_statement_inserts_store_every_value_and_refuse_one_too_long(app, producer, clock, rows):
    """insert_rows sends one value per column for a single row and one array per column for more (on
    PostgreSQL): either way every value arrives as sent, and a value too long for its column fails as a
    plain INSERT would, not cut short."""
    import datetime as dt

    from sqlalchemy.exc import DataError

    from dashboard.ingest.writing import insert_rows

    now = clock.now()
    same = {"team_id": producer.team.id, "idempotency_key": None, "created_at": now}

    def events(type_):
        return [{"key": f"evt_k{rows}_{n}", "id": f"e{n}", "type": type_, "version": 2, "data": {"n": n, "s": "é"},
                 "resource_id": None, "body": "{}", "occurred_at": now - dt.timedelta(seconds=n)} for n in range(rows)]

    insert_rows(Event.__table__, events("a.b"), same)
    db.session.commit()
    stored = {e.key: e for e in db.session.scalars(select(Event).where(Event.team_id == producer.team.id))}
    for row in events("a.b"):
        e = stored[row["key"]]
        assert (e.id, e.type, e.version, e.data, e.resource_id, e.occurred_at, e.idempotency_key) == \
            (row["id"], "a.b", 2, row["data"], None, row["occurred_at"], None)
    if db.engine.dialect.name == "postgresql":
        with pytest.raises(DataError):
            insert_rows(Event.__table__, [r | {"key": r["key"] + "x"} for r in events("t" * 201)], same)
        db.session.rollback()
