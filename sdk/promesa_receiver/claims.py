"""Idempotency: process each event id at most once.

Promesa delivers *at least once*: a timeout, a retry or a replay can bring the same event
(same ``id`` in the body, same ``webhook-id``) again. Claim the id before acting on it:

    if not claims.claim(event["id"]):
        return "", 200          # a duplicate: ANSWER IT 2xx (200/204), never 4xx/5xx,
                                # or Promesa keeps retrying it and finally dead-letters it
    process(event)

A claim is one atomic write against a unique key (an INSERT on a primary key, or Redis
``SET NX``), never a read followed by a write: two concurrent deliveries of the same event
cannot both win.

Claim-then-process has one gap: if processing fails after the claim, the retry is a
duplicate and the event is lost. Close it one of two ways:

- SQL: claim inside the transaction that does the work, ``claims.claim(id, connection=conn)``;
  if the work fails the transaction rolls back and takes the claim with it.
- Otherwise: ``claims.release(id)`` when processing fails, then answer 5xx so Promesa retries.
"""

from __future__ import annotations

import datetime as dt

from ._sql import check_id, engine_from, insert_unless_conflict, sqlalchemy

DEFAULT_TABLE = "promesa_processed_events"
DEFAULT_REDIS_PREFIX = "promesa:seen:"
DEFAULT_TTL_SECONDS = 7 * 86400


class SqlClaims:
    """Claims in a SQL table (SQLAlchemy Core; SQLite, PostgreSQL or any database with
    unique constraints). ``claim`` is an INSERT on the primary key; the IntegrityError of a
    second INSERT means "already claimed".

    Rows are never deleted by this class; prune old ones (``claimed_at``) on your own
    schedule, keeping at least as long as Promesa may still retry or replay an event.

    SQLite: use a file database; ``sqlite://`` (memory) gives each thread its own database."""

    def __init__(self, engine_or_connection_url, table_name: str = DEFAULT_TABLE, *, schema: str | None = None):
        sa = sqlalchemy()
        self._sa = sa
        self.engine = engine_from(engine_or_connection_url)
        self.table = sa.Table(
            table_name, sa.MetaData(),
            sa.Column("event_id", sa.String(255), primary_key=True),
            sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
            schema=schema,
        )

    def create_table(self) -> None:
        """Create the table if it does not exist."""
        self.table.create(self.engine, checkfirst=True)

    def drop_table(self) -> None:
        self.table.drop(self.engine, checkfirst=True)

    def claim(self, event_id: str, connection=None) -> bool:
        """True the first time ``event_id`` is claimed, False for a duplicate (answer it 2xx).

        With ``connection`` (a SQLAlchemy Connection in a transaction) the claim becomes part
        of that transaction: it commits or rolls back with your own writes."""
        check_id(event_id)
        insert = self.table.insert().values(event_id=event_id, claimed_at=dt.datetime.now(dt.timezone.utc))
        if connection is not None:
            return insert_unless_conflict(connection, insert)
        try:
            with self.engine.begin() as conn:
                conn.execute(insert)
        except self._sa.exc.IntegrityError:
            return False
        return True

    def release(self, event_id: str, connection=None) -> bool:
        """Forget a claim (processing failed; let the retry run). True if there was one."""
        check_id(event_id)
        delete = self.table.delete().where(self.table.c.event_id == event_id)
        if connection is not None:
            return connection.execute(delete).rowcount > 0
        with self.engine.begin() as conn:
            return conn.execute(delete).rowcount > 0


class RedisClaims:
    """Claims in Redis: ``SET <prefix><event_id> 1 NX EX <ttl>`` (atomic in one command).

    ``redis_client`` is a ``redis.Redis`` (or anything with the same ``set``/``delete``).
    ``ttl_seconds`` must outlast Promesa's whole retry schedule plus any replay window you
    allow; after it expires the same id would be accepted again. Claims live as long as
    Redis keeps its data: without persistence a restart forgets them."""

    def __init__(self, redis_client, prefix: str = DEFAULT_REDIS_PREFIX, ttl_seconds: int = DEFAULT_TTL_SECONDS):
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds must be a positive integer, not {ttl_seconds!r}")
        self.redis = redis_client
        self.prefix = prefix
        self.ttl_seconds = ttl_seconds

    def key(self, event_id: str) -> str:
        return self.prefix + event_id

    def claim(self, event_id: str) -> bool:
        """True the first time ``event_id`` is claimed, False for a duplicate (answer it 2xx)."""
        if not isinstance(event_id, str) or not event_id:
            raise ValueError("event id must be a non-empty string")
        return bool(self.redis.set(self.key(event_id), b"1", nx=True, ex=self.ttl_seconds))

    def release(self, event_id: str) -> bool:
        """Forget a claim (processing failed; let the retry run). True if there was one."""
        if not isinstance(event_id, str) or not event_id:
            raise ValueError("event id must be a non-empty string")
        return bool(self.redis.delete(self.key(event_id)))
