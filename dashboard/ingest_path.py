"""The producer's one-event request, without a transaction around it on PostgreSQL.

Ingest reads (the token, the routing, the catalog, a repeated key) and then writes once: on
PostgreSQL the events and their deliveries are one statement (`ingest.insert_events`), atomic on
its own. Run in autocommit, the request saves the round trips of BEGIN and COMMIT: with the
machine busy each one cost milliseconds of waiting, and a single-event request made seven.
"""

from __future__ import annotations

from flask import request

from .extensions import db

# The API endpoints whose only write is ingest's one statement.
INGEST_ENDPOINTS = frozenset({"api.create_event", "api.create_events"})


def init_app(app) -> None:
    if not app.config["SQLALCHEMY_DATABASE_URI"].startswith("postgresql+psycopg"):
        return  # elsewhere the events and deliveries are two statements: they keep their transaction

    @app.before_request
    def ingest_in_autocommit():
        # (A session already in a transaction, as in a test holding one app context, keeps it.)
        if request.endpoint in INGEST_ENDPOINTS and request.method == "POST" and not db.session().in_transaction():
            # Set before the session's first statement; the pool restores the level when it takes the connection back.
            db.session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
