"""The receiver's own database (SQLAlchemy Core; SQLite by default, PostgreSQL by URL).

- ``webhook_inbox``: every verified event, keyed by its id, with the raw body exactly as it
  was signed. The INSERT of a row is the claim: a second delivery of the same event id hits
  the primary key and is recognised as a duplicate (the same technique as the SDK's
  ``SqlClaims``, plus the body, so the job can be handed nothing but the event id).
- ``files``: the state this receiver keeps, one row per file: the newest version applied.
- ``promesa_received_events`` / ``promesa_resource_marks``: the SDK's ordering store
  (``SqlOrderingStore``): the log of decided events and each resource's high-water mark.
"""

from __future__ import annotations

import datetime as dt
import enum

import sqlalchemy as sa

from promesa_receiver import ReceivedEvent, ResourceOrdering, SqlOrderingStore

metadata = sa.MetaData()

inbox = sa.Table(
    "webhook_inbox", metadata,
    sa.Column("event_id", sa.String(255), primary_key=True),
    sa.Column("event_type", sa.String(255), nullable=True),
    sa.Column("body", sa.LargeBinary, nullable=False),         # the raw bytes that were verified
    sa.Column("signed_at", sa.BigInteger, nullable=False),      # t= of the first accepted signature
    sa.Column("received_at", sa.DateTime, nullable=False),      # naive UTC
    sa.Column("times_received", sa.Integer, nullable=False),    # > 1: Promesa delivered it again
    sa.Column("processed_at", sa.DateTime, nullable=True),      # set by the job, in its transaction
    sa.Column("outcome", sa.String(16), nullable=True),         # applied / stale / ignored
)

files = sa.Table(
    "files", metadata,
    sa.Column("resource_id", sa.String(255), primary_key=True),
    sa.Column("resource_version", sa.BigInteger, nullable=True),
    sa.Column("event_id", sa.String(255), nullable=False),      # the event that set this version
    sa.Column("event_timestamp", sa.String(40), nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
)


class Receipt(enum.Enum):
    NEW = "new"                    # first delivery of this event id: stored, needs its job
    DUPLICATE_PENDING = "pending"  # seen before, its job has not finished: enqueue again (jobs are idempotent)
    DUPLICATE_DONE = "done"        # seen and processed: nothing to do


def make_engine(url: str) -> sa.Engine:
    if url.startswith("sqlite"):
        # Web threads and workers share the file: wait for the write lock instead of failing.
        engine = sa.create_engine(url, connect_args={"timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _wal(dbapi_connection, _record):
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")   # readers do not block the writer
            cursor.close()

        return engine
    return sa.create_engine(url, pool_pre_ping=True)


class Storage:
    """The engine, the tables and the SDK's ordering helper. ``now`` returns unix seconds."""

    def __init__(self, database_url: str, now):
        self.engine = make_engine(database_url)
        self.now = now
        self.ordering_store = SqlOrderingStore(self.engine)
        self.ordering = ResourceOrdering(self.ordering_store)

    def create_tables(self) -> None:
        metadata.create_all(self.engine, checkfirst=True)
        self.ordering_store.create_tables()

    def utcnow(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.now(), dt.timezone.utc).replace(tzinfo=None)

    # -- the web request --------------------------------------------------------------
    def record(self, event: ReceivedEvent, raw_body: bytes, signed_at: int) -> Receipt:
        """Persist a verified event, atomically: one INSERT on its id, committed before we answer."""
        try:
            with self.engine.begin() as conn:
                conn.execute(inbox.insert().values(
                    event_id=event.event_id, event_type=event.type, body=raw_body, signed_at=signed_at,
                    received_at=self.utcnow(), times_received=1))
            return Receipt.NEW
        except sa.exc.IntegrityError:
            pass  # the id is taken: a duplicate (a retry, a replay, a second subscription)
        with self.engine.begin() as conn:
            processed_at = conn.execute(
                inbox.update().where(inbox.c.event_id == event.event_id)
                .values(times_received=inbox.c.times_received + 1)
                .returning(inbox.c.processed_at)).scalar_one()
        return Receipt.DUPLICATE_DONE if processed_at is not None else Receipt.DUPLICATE_PENDING

    # -- the job ------------------------------------------------------------------------
    def body_of(self, event_id: str) -> bytes | None:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(inbox.c.body).where(inbox.c.event_id == event_id)).scalar()

    def mark_processed(self, conn, event_id: str, outcome: str) -> None:
        conn.execute(inbox.update().where(inbox.c.event_id == event_id)
                     .values(processed_at=self.utcnow(), outcome=outcome))

    def unprocessed_ids(self) -> list[str]:
        with self.engine.connect() as conn:
            return list(conn.execute(sa.select(inbox.c.event_id).where(inbox.c.processed_at.is_(None))
                                     .order_by(inbox.c.received_at)).scalars())
