"""The producer's one-event request, without a transaction or an ORM session on PostgreSQL.

Ingest reads (the token, the routing and the catalog in one statement; a repeated key) and then writes
once: on PostgreSQL the events and their deliveries are one statement (`ingest.writing.insert_events`), atomic
on its own. So the ingest endpoints read and write on a connection of their own in autocommit:
- no BEGIN and COMMIT round trips (on a busy machine each one is a wait, and a request would make several);
- no ORM session around two Core statements: taking its connection, switching it to autocommit and
  committing it cost CPU that two statements do not need;
- no SQLAlchemy execution either: the statements are compiled once and sent on psycopg's cursor, from a
  pool whose connections are in autocommit from the start (`read`, `write`, `_autocommit_engine`).
Elsewhere (SQLite, or a caller already in a transaction) ingest uses the session, as everything else does.
"""

from __future__ import annotations

import functools

from flask import current_app, g, request
from psycopg.rows import namedtuple_row
from sqlalchemy import create_engine, event, exc
from sqlalchemy.engine import Connection, Engine

from dashboard.core.extensions import db
from dashboard.core.outages import drop_dead_connections
from dashboard.ingest.routing_cache import RoutingCache

# The API endpoints whose only write is ingest's one statement.
INGEST_ENDPOINTS = frozenset({"api.create_event", "api.create_events"})


def in_autocommit() -> bool:
    """Is this request on ingest's own connection (PostgreSQL, no transaction held by the caller)?"""
    return bool(g.get("ingest_autocommit"))


def connection() -> Connection:
    """The session's connection, where ingest runs inside the caller's transaction (SQLite, tests, a
    test event sent from a page)."""
    return db.session.connection()


def read(statement, params: dict) -> list:
    """The rows of a Core SELECT (attribute access by column name)."""
    if not in_autocommit():
        return connection().execute(statement, params).all()
    sql, defaults = _compiled(statement, engine().dialect)
    return _run(sql, defaults | params, fetch=True)


def write(sql: str, params) -> int:
    """Run one write given as the driver's SQL (psycopg's placeholders; see ingest._insert_plan); returns
    how many rows it wrote (of its main statement)."""
    if not in_autocommit():
        return connection().exec_driver_sql(sql, params).rowcount
    g.promesa_commit_sent = True  # in autocommit it commits as it runs: a lost answer must not run it again
    return _run(sql, params, fetch=False)


def engine() -> Engine:
    """The app's pool of autocommit connections for ingest (PostgreSQL)."""
    return current_app.extensions[_ENGINE]


def routing_cache():
    """The app's kept routing answers (PostgreSQL; see routing_cache)."""
    return current_app.extensions[_ROUTING_CACHE]


@functools.lru_cache(maxsize=64)
def _compiled(statement, dialect) -> tuple[str, dict]:
    """A statement's SQL for psycopg and the values of its literal parameters, compiled once (as
    ingest._insert_plan is built once)."""
    compiled = statement.compile(dialect=dialect)
    return compiled.string, {k: v for k, v in compiled.params.items() if v is not None}


def pooled_connection():
    """This request's connection from ingest's pool (taken on first use, given back at its end)."""
    fairy = g.get("ingest_connection")
    if fairy is None:
        pool = engine()
        try:
            fairy = g.ingest_connection = pool.raw_connection()
        except pool.dialect.loaded_dbapi.Error as error:  # the pool raises the driver's own: wrap it as SQLAlchemy does
            raise exc.DBAPIError.instance(None, None, error, pool.dialect.loaded_dbapi.Error,
                                          dialect=pool.dialect) from error
    return fairy


def _run(sql: str, params, fetch: bool) -> list | int:
    """One statement on psycopg's cursor itself. SQLAlchemy's execution (compile cache, execution context,
    result) would double the routing read's CPU; ingest sends two plain statements and needs none of it.
    Errors come out as SQLAlchemy's would, with a lost connection invalidated (outages, store_once)."""
    fairy = pooled_connection()
    driver = fairy.driver_connection
    try:
        with driver.cursor(row_factory=namedtuple_row) as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if fetch else cursor.rowcount
    except Exception as error:
        dialect = engine().dialect
        if not isinstance(error, dialect.loaded_dbapi.Error):
            raise
        lost = dialect.is_disconnect(error, driver, None)
        if lost:  # the next statement (a request run again, store_once's look) takes a new one
            fairy.invalidate(error)
            _give_back()
        raise exc.DBAPIError.instance(sql, params, error, dialect.loaded_dbapi.Error, connection_invalidated=lost,
                                      dialect=dialect) from error


def commit() -> None:
    """Commit ingest's write (in autocommit it is committed already)."""
    if not in_autocommit():
        db.session.commit()


def discard() -> None:
    """After a write whose connection died under it: let that connection go (the next statement takes a new
    one), and roll the session back."""
    _give_back()
    db.session.rollback()


def _give_back() -> None:
    fairy = g.pop("ingest_connection", None)
    if fairy is not None:
        fairy.close()


_ENGINE = "promesa.ingest_engine"
_ROUTING_CACHE = "promesa.routing_cache"


def _autocommit_engine(app) -> Engine:
    """A pool of its own, of connections in autocommit from the start, so no request switches a connection to
    autocommit and back (nor the pool rolls it back on return). Nothing here opens a transaction, so there
    is nothing to reset on return."""
    engine = create_engine(app.config["SQLALCHEMY_DATABASE_URI"], isolation_level="AUTOCOMMIT",
                           pool_reset_on_return=None, **app.config["SQLALCHEMY_ENGINE_OPTIONS"])
    drop_dead_connections(engine)
    return engine


def init_app(app) -> None:
    if not app.config["SQLALCHEMY_DATABASE_URI"].startswith("postgresql+psycopg"):
        return  # elsewhere the events and deliveries are two statements: they keep their transaction
    engine = app.extensions[_ENGINE] = _autocommit_engine(app)
    app.extensions[_ROUTING_CACHE] = RoutingCache()
    with app.app_context():
        # Whoever disposes of the app's connections (tests, a forked process) disposes of these too.
        event.listen(db.engine, "engine_disposed", lambda _engine: engine.dispose())

    @app.before_request
    def ingest_in_autocommit():
        # A session already in a transaction keeps it; asked only of an existing session, so none is made to ask.
        if request.endpoint in INGEST_ENDPOINTS and request.method == "POST" \
                and not (db.session.registry.has() and db.session().in_transaction()):
            g.ingest_autocommit = True

    @app.teardown_request
    def give_back_the_connection(_exc):
        g.pop("ingest_autocommit", None)
        _give_back()
