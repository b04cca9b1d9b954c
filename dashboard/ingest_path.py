"""The producer's one-event request, without a transaction or an ORM session on PostgreSQL.

Ingest reads (the token, the routing and the catalog in one statement; a repeated key) and then writes
once: on PostgreSQL the events and their deliveries are one statement (`ingest.insert_events`), atomic
on its own. So the ingest endpoints read and write on a connection of their own in autocommit:
- no BEGIN and COMMIT round trips (with the machine busy each one cost milliseconds of waiting, and a
  single-event request made seven);
- no ORM session around two Core statements: taking its connection, switching it to autocommit and
  committing it were a fifth of the request's CPU.
Elsewhere (SQLite, or a caller already in a transaction) ingest uses the session, as everything else does.
"""

from __future__ import annotations

from flask import g, request
from sqlalchemy.engine import Connection

from .extensions import db

# The API endpoints whose only write is ingest's one statement.
INGEST_ENDPOINTS = frozenset({"api.create_event", "api.create_events"})


def connection() -> Connection:
    """The connection ingest reads its routing from and writes on."""
    if not g.get("ingest_autocommit"):
        return db.session.connection()
    conn = g.get("ingest_connection")
    if conn is None:
        # From the app's pool; the pool restores transactions when it takes the connection back.
        conn = g.ingest_connection = db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    return conn


def commit() -> None:
    """Commit ingest's write (in autocommit it is committed already)."""
    if not g.get("ingest_autocommit"):
        db.session.commit()


def discard() -> None:
    """After a write whose connection died under it: let that connection go (SQLAlchemy has invalidated it,
    and the next `connection()` is a new one), and roll the session back."""
    _give_back()
    db.session.rollback()


def _give_back() -> None:
    conn = g.pop("ingest_connection", None)
    if conn is not None:
        conn.close()


def init_app(app) -> None:
    if not app.config["SQLALCHEMY_DATABASE_URI"].startswith("postgresql+psycopg"):
        return  # elsewhere the events and deliveries are two statements: they keep their transaction

    @app.before_request
    def ingest_in_autocommit():
        # (A session already in a transaction, as in a test holding one app context, keeps it.)
        if request.endpoint in INGEST_ENDPOINTS and request.method == "POST" and not db.session().in_transaction():
            g.ingest_autocommit = True

    @app.teardown_request
    def give_back_the_connection(_exc):
        g.pop("ingest_autocommit", None)
        _give_back()
