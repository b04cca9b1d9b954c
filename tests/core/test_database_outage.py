"""The database away: told apart from a bad statement, waited out with backoff, and logged once per
state change (dashboard.core.outages)."""

from __future__ import annotations

import logging
import socket
import threading

import pytest
import sqlalchemy as sa

from dashboard.core.outages import DatabaseOutage, database_outage, database_unavailable
from dashboard.operations.sweeper import sweep_forever


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NOBODY = f"postgresql+psycopg://postgres@127.0.0.1:{_closed_port()}/promesa"


@pytest.fixture(autouse=True)
def outage_reset():
    yield
    database_outage.succeeded("test")  # the process-wide tracker: leave it as found


def _refused() -> sa.exc.DBAPIError:
    engine = sa.create_engine(NOBODY, poolclass=sa.pool.NullPool)
    try:
        engine.connect()
    except sa.exc.DBAPIError as error:
        return error
    finally:
        engine.dispose()
    raise AssertionError("something listens on the closed port")


def test_a_refused_connection_is_the_database_away_and_a_bad_statement_is_not(database_url):
    assert database_unavailable(_refused())
    engine = sa.create_engine(database_url)
    with pytest.raises(sa.exc.DBAPIError) as bad, engine.connect() as conn:
        conn.execute(sa.text("SELECT * FROM no_such_table"))
    engine.dispose()
    assert not database_unavailable(bad.value)
    assert not database_unavailable(ValueError("not a database error"))


def test_waiting_for_it_logs_once_and_gives_up_at_the_timeout(caplog, database_url):
    outage = DatabaseOutage(first_wait=0.05, max_wait=0.1)
    away = sa.create_engine(NOBODY, poolclass=sa.pool.NullPool)
    with caplog.at_level(logging.INFO, logger="dashboard.core.outages"):
        assert outage.wait_until_back(away, "worker", timeout=0.6) is False
        assert outage.away
        back = sa.create_engine(database_url)
        assert outage.wait_until_back(back, "worker") is True
    messages = [r.getMessage() for r in caplog.records]
    assert sum("the database is unreachable" in m for m in messages) == 1, messages
    assert sum("the database is back" in m for m in messages) == 1, messages
    assert not outage.away
    away.dispose()
    back.dispose()


def test_the_sweeper_waits_the_database_out_with_one_line_and_no_traceback(config, caplog):
    from dashboard.app import create_app

    app = create_app({**config, "SQLALCHEMY_DATABASE_URI": NOBODY})
    stop = threading.Event()
    with caplog.at_level(logging.INFO):
        sweeper = threading.Thread(target=sweep_forever, args=(app, 60.0, stop), daemon=True)
        sweeper.start()
        stop.wait(2.5)  # a few tries of its backoff (0.5 s, 1 s, ...), not one pass a minute
        stop.set()
        sweeper.join(10)
    assert not sweeper.is_alive()
    unreachable = [r for r in caplog.records if "the database is unreachable" in r.getMessage()]
    assert len(unreachable) == 1 and unreachable[0].getMessage().startswith("sweeper:")
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]
    assert database_outage.away


def test_a_pool_that_gave_up_reconnecting_is_the_database_away(database_url):
    """Every connection made on checkout dead at once (a server accepting, then ending it, as one shutting
    down does): SQLAlchemy's pool gives up with an error that carries no DBAPI error."""
    engine = sa.create_engine(database_url)

    @sa.event.listens_for(engine, "checkout")
    def _always_dead(dbapi_connection, record, proxy):
        raise sa.exc.DisconnectionError("the server closed it")

    with pytest.raises(sa.exc.InvalidRequestError) as gave_up:
        engine.connect()
    engine.dispose()
    assert database_unavailable(gave_up.value)
    assert not database_unavailable(sa.exc.InvalidRequestError("a programming mistake"))
