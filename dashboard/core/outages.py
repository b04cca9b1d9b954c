"""Riding out what Promesa depends on: PostgreSQL connections that died, and Redis going away.

- A pooled PostgreSQL connection whose server side was terminated (`pg_terminate_backend`, a
  restart, a failover) is dropped when it is checked out, before anyone uses it: the server has
  already said goodbye on its socket, so checking costs a poll() and no round trip.
- Work that is safe to do twice (a claim, an attempt write that checks it was not already made,
  a web request that committed nothing yet) is tried once more on a new connection when the
  connection is lost under it.
- Loops that need Redis or the database (workers, promoter, sweeper) wait it out with backoff and
  say so once when it goes away and once when it is back, not a traceback per try.
- A database that is away is told apart from a bad statement (`database_unavailable`): the web
  answers it with 503 and Retry-After, never 500.
"""

from __future__ import annotations

import logging
import select
import threading
import time

import psycopg
import redis
from flask import Flask, g, has_request_context, request
from sqlalchemy import event, exc

from dashboard.core.extensions import db

log = logging.getLogger(__name__)

# What a Redis that is away (down, restarting, unreachable) raises; BusyLoadingError is a ConnectionError.
REDIS_AWAY = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


# -- PostgreSQL ---------------------------------------------------------------------------
def drop_dead_connections(engine) -> None:
    """Check every pooled PostgreSQL connection as it is checked out, and replace a dead one.

    An idle connection has nothing to read; a terminated one has the server's FATAL message or
    EOF waiting on its socket. Raising DisconnectionError here makes the pool discard it and
    connect again (SQLAlchemy's documented hook for custom pessimistic checks)."""

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_connection, connection_record, connection_proxy):
        if getattr(dbapi_connection, "closed", False) or _has_unread_data(dbapi_connection):
            raise exc.DisconnectionError("the server closed this pooled connection")


def bounded_waits(options: dict, seconds: float) -> dict:
    """Engine options whose PostgreSQL connections wait about `seconds` at most for a server that stopped
    answering (a network cut: nothing refused, nothing answered), instead of the kernel's quarter of an hour:
    to connect, and for what was sent to be acknowledged; idle ones are probed, so a dead one is found before
    it is used. A slow query is not cut short: the server acknowledges it, then takes its time."""
    libpq = {"connect_timeout": max(2, round(seconds)), "tcp_user_timeout": round(seconds * 1000), "keepalives": 1,
             "keepalives_idle": max(1, round(seconds)), "keepalives_interval": max(1, round(seconds / 3)),
             "keepalives_count": 3}
    return {**options, "connect_args": {**libpq, **options.get("connect_args", {})}}


def _has_unread_data(dbapi_connection) -> bool:
    try:
        fd = dbapi_connection.fileno()
    except Exception:  # noqa: BLE001 - no socket to look at: let the first statement tell
        return False
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(0))


class ReconnectingFlask(Flask):
    """A request whose database connection died under it before anything was committed (a backend
    terminated mid-request) runs once more on a new connection, instead of answering 500. Once a
    COMMIT was sent, its outcome is unknown and the error stands."""

    def dispatch_request(self):
        g.promesa_commit_sent = False
        request.get_data()  # kept, so that a second run reads the same body (a view may read it uncached)
        try:
            return super().dispatch_request()
        except exc.DBAPIError as error:
            if not error.connection_invalidated or g.promesa_commit_sent:
                raise
            db.session.rollback()
            log.warning("%s %s: the database connection was lost (%s); running it again on a new one",
                        request.method, request.path, type(error.orig).__name__)
            return super().dispatch_request()


def note_commits(engine) -> None:
    """Tell ReconnectingFlask when a request has sent a COMMIT."""

    @event.listens_for(engine, "commit")
    def _commit(connection):
        if has_request_context():
            g.promesa_commit_sent = True

    @event.listens_for(engine, "before_cursor_execute")
    def _autocommit_write(connection, cursor, statement, parameters, context, executemany):
        # In autocommit (the single-event ingest on PostgreSQL) a write commits itself as it runs.
        if has_request_context() and not statement.lstrip()[:6].upper() == "SELECT" \
                and connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            g.promesa_commit_sent = True


def retry_on_lost_connection(work, what: str):
    """Run `work()`; if the database connection was lost under it, once more on a new connection.
    Only for work that is safe to repeat after a failure that may or may not have committed."""
    try:
        return work()
    except exc.DBAPIError as error:
        if not error.connection_invalidated:
            raise
        log.warning("%s: the database connection was lost (%s); trying again on a new one",
                    what, str(error.orig).splitlines()[0] if error.orig else error)
    return work()


# -- PostgreSQL away -------------------------------------------------------------------------
# SQLSTATEs of a server that is going, gone or not yet back: class 08 (connection exception),
# admin_shutdown, crash_shutdown, cannot_connect_now (starting up or in recovery).
_AWAY_SQLSTATES = ("57P01", "57P02", "57P03")
# What the pool raises when every connection it made on checkout was dead at once (a server that
# accepted and then ended it, as a shutting-down one does): no DBAPI error is attached.
POOL_GAVE_UP = "This connection is closed"


def database_unavailable_within(error: BaseException | None) -> bool:
    """Is the database being away the cause of this error, or of one it was raised during?"""
    seen = set()
    while error is not None and id(error) not in seen:
        if database_unavailable(error):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def database_unavailable(error: BaseException) -> bool:
    """Is this the database being away (down, restarting, unreachable), not a bad statement?
    A failed connect carries no SQLSTATE; a connection the server ended is invalidated."""
    if isinstance(error, exc.InvalidRequestError) and str(error) == POOL_GAVE_UP:
        return True
    if isinstance(error, psycopg.OperationalError):  # the driver's own, from a raw connection or the pool
        orig = error
    elif not isinstance(error, exc.DBAPIError):
        return False
    elif error.connection_invalidated:
        return True
    else:
        orig = error.orig
    if not isinstance(orig, psycopg.OperationalError):
        return False  # SQLite's "database is locked" and the like are not an outage
    state = getattr(orig, "sqlstate", None)
    return state is None or state.startswith("08") or state in _AWAY_SQLSTATES


# -- outages of either -------------------------------------------------------------------------
class Outage:
    """One line when a service goes away, one when it is back, and a backoff between tries.

    Shared by the loops of one process (thread-safe): a promoter and a worker that both notice
    the same outage log it once."""

    def __init__(self, name: str, first_wait: float = 0.5, max_wait: float = 5.0):
        self.name = name
        self.first_wait, self.max_wait = first_wait, max_wait
        self._lock = threading.Lock()
        self._since: float | None = None
        self._wait = first_wait

    @property
    def away(self) -> bool:
        return self._since is not None

    def failed(self, error: Exception, who: str) -> float:
        """Note a failed call; return how long to wait before the next try."""
        with self._lock:
            if self._since is None:
                self._since = time.monotonic()
                self._wait = self.first_wait
                log.error("%s: %s is unreachable (%s); waiting for it, retrying with backoff", who, self.name,
                          str(error).splitlines()[0] if str(error) else type(error).__name__)
            wait = self._wait
            self._wait = min(self.max_wait, self._wait * 2)
            return wait

    def succeeded(self, who: str) -> None:
        if self._since is None:  # the common case, without the lock
            return
        with self._lock:
            if self._since is not None:
                log.warning("%s: %s is back after %.1f s; carrying on", who, self.name, time.monotonic() - self._since)
                self._since = None


class RedisOutage(Outage):
    def __init__(self, first_wait: float = 0.5, max_wait: float = 5.0):
        super().__init__("Redis", first_wait, max_wait)

    def wait_until_back(self, conn: redis.Redis, who: str, stop: threading.Event | None = None) -> bool:
        """Block until Redis answers a PING (True), or until `stop` is set (False)."""
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                conn.ping()
            except REDIS_AWAY as error:
                stop.wait(self.failed(error, who))
                continue
            self.succeeded(who)
            return True
        return False


class DatabaseOutage(Outage):
    def __init__(self, first_wait: float = 0.5, max_wait: float = 5.0):
        super().__init__("the database", first_wait, max_wait)

    def wait_until_back(self, engine, who: str, stop: threading.Event | None = None,
                        timeout: float | None = None) -> bool:
        """Block until the database answers `SELECT 1` (True), or until `stop` is set or `timeout`
        seconds have passed (False)."""
        stop = stop or threading.Event()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not stop.is_set():
            try:
                with engine.connect() as conn:
                    conn.exec_driver_sql("SELECT 1")
            except exc.DBAPIError as error:
                if not database_unavailable(error):
                    raise
                wait = self.failed(error, who)
                if deadline is not None and time.monotonic() + wait > deadline:
                    return False
                stop.wait(wait)
                continue
            self.succeeded(who)
            return True
        return False


# One per process: every loop of a worker (RQ's, the promoter, a drain) reports the same outage once.
redis_outage = RedisOutage()
database_outage = DatabaseOutage()
