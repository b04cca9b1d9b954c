"""Out-of-order delivery: decide, per event, whether to apply it to your copy of a resource.

Promesa retries failed deliveries, so events about one resource can arrive out of order
(``file.updated`` v8 succeeds while v7 is still being retried) and more than once. The
thin event body says which resource changed and how new the change is:

    {"id": "evt_...", "type": "file.updated", "version": 1,
     "timestamp": "2026-11-29T18:00:00.123Z",
     "data": {"resource_id": "f_123", "resource_version": 7}}

THE RULE (``ResourceOrdering.receive``):

1. Deduplicate by event ``id`` first. An id already received is a DUPLICATE: nothing is
   stored or applied again, and the delivery must be answered 2xx.
2. Persist every other event (the received-events log), applied or not.
3. Keep, per resource (``data.resource_id``), a high-water mark: the
   (``timestamp``, ``resource_version``) of the newest event *applied* so far.
4. Apply an event only if it is newer than the mark (or the resource has no mark yet);
   the mark then becomes that event's (timestamp, resource_version). "Newer" is:

   - when both the event and the mark carry a ``resource_version``: a strictly greater
     ``resource_version``. Versions are authoritative; timestamps are not consulted (a
     producer's clock can step back, its version counter cannot). An equal version is
     the resource state already applied: stale.
   - otherwise (no version on either side): ``timestamp >= mark timestamp``. Equal
     timestamps are two distinct events (they have different ids) and BOTH are applied;
     only a strictly older timestamp is stale.

5. An event that is not newer is STALE: it is stored (step 2) but its state is not
   applied, and the mark does not move.

Events without ``data.resource_id`` have nothing to be ordered against: after
deduplication they are stored and applied. The top-level ``version`` is the version of
the event *envelope* (the body's schema), not of the resource; it plays no part here.

Each decision is atomic: the dedup insert, the read of the mark (``SELECT ... FOR
UPDATE`` on PostgreSQL) and its update commit together, so concurrent deliveries of one
resource are serialised and cannot both move the mark. To make *applying* the state part
of the same atomic step (so a crash while applying does not turn the retry into a
duplicate), do the work inside ``receiving``::

    with ordering.receiving(event) as decision:     # or receive(event, connection=conn)
        if decision.should_apply:
            refresh_file(decision.resource_id)       # raises -> the decision rolls back
    return "", 200                                   # duplicates and stale events too

The store is pluggable: ``InMemoryOrderingStore`` (one process; tests) and
``SqlOrderingStore`` (SQLAlchemy Core; a table of received events and a table of
per-resource high-water marks).
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ._sql import MAX_ID_LENGTH, engine_from, insert_unless_conflict, sqlalchemy
from .errors import InvalidEvent

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MICROSECOND = dt.timedelta(microseconds=1)
_INT64 = 2 ** 63
_MAX_RACES = 5


# -- values ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mark:
    """A resource's high-water mark: the newest event applied to it so far."""

    event_id: str
    timestamp_us: int  # microseconds since the epoch, UTC
    resource_version: int | None

    @property
    def timestamp(self) -> dt.datetime:
        return _EPOCH + self.timestamp_us * _MICROSECOND


@dataclass(frozen=True)
class ReceivedEvent:
    """The fields of an event body the ordering rule needs, parsed and checked."""

    event_id: str
    type: str | None
    resource_id: str | None
    resource_version: int | None
    timestamp_us: int
    payload: dict = field(compare=False, repr=False)

    @property
    def timestamp(self) -> dt.datetime:
        return _EPOCH + self.timestamp_us * _MICROSECOND

    def as_mark(self) -> Mark:
        return Mark(self.event_id, self.timestamp_us, self.resource_version)


@dataclass(frozen=True)
class StoredEvent:
    event: ReceivedEvent
    applied: bool


class Action(str, enum.Enum):
    APPLY = "apply"          # new and newer than the mark: apply its state
    STALE = "stale"          # new but older than the mark: stored, state not applied
    DUPLICATE = "duplicate"  # the id was received before: nothing stored or applied


@dataclass(frozen=True)
class Decision:
    """What to do with one delivery. Whatever the action, answer the delivery 2xx."""

    action: Action
    event: ReceivedEvent
    mark: Mark | None = None       # the resource's high-water mark after this decision
    previous: Mark | None = None   # for APPLY: the mark it replaced (None: first event)
    reason: str = ""

    @property
    def should_apply(self) -> bool:
        return self.action is Action.APPLY

    @property
    def is_duplicate(self) -> bool:
        return self.action is Action.DUPLICATE

    @property
    def is_stale(self) -> bool:
        return self.action is Action.STALE

    @property
    def event_id(self) -> str:
        return self.event.event_id

    @property
    def resource_id(self) -> str | None:
        return self.event.resource_id


# -- parsing and the comparison ----------------------------------------------------------------
def parse_timestamp(value) -> int:
    """Microseconds since the epoch of an ISO 8601 timestamp with a zone (``...Z``) or of a
    number of unix seconds."""
    if isinstance(value, str):
        try:
            when = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise InvalidEvent(f"timestamp {value!r} is not ISO 8601") from None
        if when.tzinfo is None or when.utcoffset() is None:
            raise InvalidEvent(f"timestamp {value!r} has no time zone (expected e.g. ...Z)")
        return (when - _EPOCH) // _MICROSECOND
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(round(value * 1_000_000))
    raise InvalidEvent("timestamp must be an ISO 8601 string or unix seconds")


def _short_id(value, what: str, required: bool) -> str | None:
    if value is None:
        if required:
            raise InvalidEvent(f"the event has no {what}")
        return None
    if not isinstance(value, str) or not value:
        raise InvalidEvent(f"{what} must be a non-empty string")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidEvent(f"{what} is longer than {MAX_ID_LENGTH} characters")
    return value


def parse_event(event: dict | bytes | str) -> ReceivedEvent:
    """Check and extract ``id``, ``type``, ``timestamp``, ``data.resource_id`` and
    ``data.resource_version`` from an event body (a dict, or its JSON text)."""
    if isinstance(event, (bytes, bytearray, str)):
        try:
            event = json.loads(event)
        except ValueError:
            raise InvalidEvent("the event body is not JSON") from None
    if not isinstance(event, dict):
        raise InvalidEvent("the event body must be a JSON object")
    event_id = _short_id(event.get("id"), "id", required=True)
    event_type = _short_id(event.get("type"), "type", required=False)
    if "timestamp" not in event:
        raise InvalidEvent("the event has no timestamp")
    timestamp_us = parse_timestamp(event["timestamp"])
    data = event.get("data")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InvalidEvent("data must be a JSON object")
    resource_id = _short_id(data.get("resource_id"), "data.resource_id", required=False)
    version = data.get("resource_version")
    if version is not None:
        if isinstance(version, bool) or not isinstance(version, int):
            raise InvalidEvent("data.resource_version must be an integer")
        if not -_INT64 <= version < _INT64:
            raise InvalidEvent("data.resource_version does not fit in 64 bits")
    return ReceivedEvent(event_id, event_type, resource_id, version, timestamp_us, event)


def is_newer(event: ReceivedEvent | Mark, mark: Mark) -> bool:
    """The comparison of rule 4: by resource_version when both carry one, else by
    timestamp, where an equal timestamp counts as newer (both events are applied)."""
    if event.resource_version is not None and mark.resource_version is not None:
        return event.resource_version > mark.resource_version
    return event.timestamp_us >= mark.timestamp_us


# -- stores ---------------------------------------------------------------------------------------
class OrderingTransaction(Protocol):
    """One atomic unit of a store; see ``InMemoryOrderingStore`` and ``SqlOrderingStore``."""

    def add_event(self, event: ReceivedEvent) -> bool:
        """Store the event (not applied yet); False if its id is already stored."""

    def lock_mark(self, resource_id: str) -> Mark | None:
        """The resource's mark, locked until the transaction ends."""

    def put_mark(self, resource_id: str, new: Mark, previous: Mark | None) -> bool:
        """Replace ``previous`` with ``new``; False if the mark is no longer ``previous``
        (a concurrent first event created it): the caller reads it again and re-decides."""

    def set_applied(self, event_id: str, applied: bool) -> None: ...


class OrderingStore(Protocol):
    def transaction(self, connection: Any = None) -> Any:
        """A context manager yielding an ``OrderingTransaction``; commits on a normal exit,
        rolls back on an exception."""


class InMemoryOrderingStore:
    """Events and marks in dicts, one process only (tests, scripts). A transaction holds a
    lock and commits its changes when it ends without an exception."""

    def __init__(self):
        self._lock = threading.RLock()
        self._events: dict[str, StoredEvent] = {}
        self._marks: dict[str, Mark] = {}

    @contextmanager
    def transaction(self, connection=None) -> Iterator[_MemoryTransaction]:
        if connection is not None:
            raise TypeError("the in-memory store takes no database connection")
        with self._lock:
            tx = _MemoryTransaction(self)
            yield tx
            self._events.update(tx.events)
            self._marks.update(tx.marks)

    def get_event(self, event_id: str) -> StoredEvent | None:
        with self._lock:
            return self._events.get(event_id)

    def get_mark(self, resource_id: str) -> Mark | None:
        with self._lock:
            return self._marks.get(resource_id)

    def events(self, resource_id: str | None = None) -> list[StoredEvent]:
        with self._lock:
            return [e for e in self._events.values() if resource_id is None or e.event.resource_id == resource_id]


class _MemoryTransaction:
    def __init__(self, store: InMemoryOrderingStore):
        self.store = store
        self.events: dict[str, StoredEvent] = {}
        self.marks: dict[str, Mark] = {}

    def add_event(self, event: ReceivedEvent) -> bool:
        if event.event_id in self.events or event.event_id in self.store._events:
            return False
        self.events[event.event_id] = StoredEvent(event, applied=False)
        return True

    def lock_mark(self, resource_id: str) -> Mark | None:
        if resource_id in self.marks:
            return self.marks[resource_id]
        return self.store._marks.get(resource_id)

    def put_mark(self, resource_id: str, new: Mark, previous: Mark | None) -> bool:
        if self.lock_mark(resource_id) != previous:
            return False
        self.marks[resource_id] = new
        return True

    def set_applied(self, event_id: str, applied: bool) -> None:
        self.events[event_id] = replace(self.events[event_id], applied=applied)


class SqlOrderingStore:
    """Two tables through SQLAlchemy Core (SQLite, PostgreSQL):

    - ``events_table``: every received event, keyed by id (the dedup constraint), with its
      resource, timestamp (microseconds), resource_version, whether it was applied, and the
      whole body as JSON text;
    - ``marks_table``: one row per resource, its high-water mark.

    ``transaction(connection)`` runs inside your own transaction when given a Connection
    (PostgreSQL: in the default READ COMMITTED isolation); otherwise it opens one.
    On SQLite the first statement of a decision is a write, so concurrent decisions queue
    on SQLite's write lock (up to the driver's busy timeout)."""

    def __init__(self, engine_or_connection_url, events_table: str = "promesa_received_events",
                 marks_table: str = "promesa_resource_marks", *, schema: str | None = None):
        sa = sqlalchemy()
        self.engine = engine_from(engine_or_connection_url)
        self.metadata = sa.MetaData()
        self.events_table = sa.Table(
            events_table, self.metadata,
            sa.Column("event_id", sa.String(MAX_ID_LENGTH), primary_key=True),
            sa.Column("type", sa.String(MAX_ID_LENGTH), nullable=True),
            sa.Column("resource_id", sa.String(MAX_ID_LENGTH), nullable=True, index=True),
            sa.Column("timestamp_us", sa.BigInteger, nullable=False),
            sa.Column("resource_version", sa.BigInteger, nullable=True),
            sa.Column("applied", sa.Boolean, nullable=False),
            sa.Column("payload", sa.Text, nullable=False),
            sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
            schema=schema,
        )
        self.marks_table = sa.Table(
            marks_table, self.metadata,
            sa.Column("resource_id", sa.String(MAX_ID_LENGTH), primary_key=True),
            sa.Column("event_id", sa.String(MAX_ID_LENGTH), nullable=False),
            sa.Column("timestamp_us", sa.BigInteger, nullable=False),
            sa.Column("resource_version", sa.BigInteger, nullable=True),
            sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
            schema=schema,
        )

    def create_tables(self) -> None:
        self.metadata.create_all(self.engine, checkfirst=True)

    def drop_tables(self) -> None:
        self.metadata.drop_all(self.engine, checkfirst=True)

    @contextmanager
    def transaction(self, connection=None) -> Iterator[_SqlTransaction]:
        if connection is not None:
            yield _SqlTransaction(self, connection)
            return
        with self.engine.begin() as conn:
            yield _SqlTransaction(self, conn)

    def get_event(self, event_id: str) -> StoredEvent | None:
        t = self.events_table
        sa = sqlalchemy()
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(t).where(t.c.event_id == event_id)).mappings().first()
        if row is None:
            return None
        event = ReceivedEvent(row["event_id"], row["type"], row["resource_id"], row["resource_version"],
                              row["timestamp_us"], json.loads(row["payload"]))
        return StoredEvent(event, bool(row["applied"]))

    def get_mark(self, resource_id: str) -> Mark | None:
        with self.engine.connect() as conn:
            return _SqlTransaction(self, conn).read_mark(resource_id, lock=False)


class _SqlTransaction:
    def __init__(self, store: SqlOrderingStore, conn):
        self.store = store
        self.conn = conn
        self.sa = sqlalchemy()

    def add_event(self, event: ReceivedEvent) -> bool:
        insert = self.store.events_table.insert().values(
            event_id=event.event_id, type=event.type, resource_id=event.resource_id,
            timestamp_us=event.timestamp_us, resource_version=event.resource_version, applied=False,
            payload=json.dumps(event.payload, separators=(",", ":")),
            received_at=dt.datetime.now(dt.timezone.utc))
        return insert_unless_conflict(self.conn, insert)

    def read_mark(self, resource_id: str, lock: bool) -> Mark | None:
        t = self.store.marks_table
        query = self.sa.select(t.c.event_id, t.c.timestamp_us, t.c.resource_version).where(t.c.resource_id == resource_id)
        if lock:
            query = query.with_for_update()
        row = self.conn.execute(query).first()
        return None if row is None else Mark(row.event_id, row.timestamp_us, row.resource_version)

    def lock_mark(self, resource_id: str) -> Mark | None:
        return self.read_mark(resource_id, lock=True)

    def put_mark(self, resource_id: str, new: Mark, previous: Mark | None) -> bool:
        t = self.store.marks_table
        values = dict(event_id=new.event_id, timestamp_us=new.timestamp_us, resource_version=new.resource_version,
                      updated_at=dt.datetime.now(dt.timezone.utc))
        if previous is None:
            return insert_unless_conflict(self.conn, t.insert().values(resource_id=resource_id, **values))
        update = t.update().where(t.c.resource_id == resource_id, t.c.event_id == previous.event_id).values(**values)
        return self.conn.execute(update).rowcount == 1

    def set_applied(self, event_id: str, applied: bool) -> None:
        t = self.store.events_table
        self.conn.execute(t.update().where(t.c.event_id == event_id).values(applied=applied))


# -- the helper -----------------------------------------------------------------------------------
class ResourceOrdering:
    """Applies THE RULE of this module's docstring over a pluggable store.

    ``receive(event)`` decides and commits. ``receiving(event)`` is a context manager that
    keeps the decision's transaction open while you apply the state: an exception rolls the
    decision back (the retry is then processed, not dropped as a duplicate), and per-resource
    work is serialised by the mark's lock so two newer events cannot apply out of order."""

    def __init__(self, store: OrderingStore | None = None):
        self.store = store if store is not None else InMemoryOrderingStore()

    def receive(self, event: dict | bytes | str, connection=None) -> Decision:
        with self.receiving(event, connection=connection) as decision:
            return decision

    @contextmanager
    def receiving(self, event: dict | bytes | str, connection=None) -> Iterator[Decision]:
        parsed = event if isinstance(event, ReceivedEvent) else parse_event(event)
        with self.store.transaction(connection) as tx:
            yield self._decide(tx, parsed)

    def _decide(self, tx: OrderingTransaction, event: ReceivedEvent) -> Decision:
        if not tx.add_event(event):
            return Decision(Action.DUPLICATE, event, reason=f"event {event.event_id} was received before")
        if event.resource_id is None:
            tx.set_applied(event.event_id, True)
            return Decision(Action.APPLY, event, reason="no data.resource_id: nothing to order against")
        for _ in range(_MAX_RACES):
            mark = tx.lock_mark(event.resource_id)
            if mark is not None and not is_newer(event, mark):
                tx.set_applied(event.event_id, False)
                return Decision(Action.STALE, event, mark=mark,
                                reason=f"not newer than event {mark.event_id}, already applied to {event.resource_id}")
            new = event.as_mark()
            if tx.put_mark(event.resource_id, new, mark):
                tx.set_applied(event.event_id, True)
                why = "first event of the resource" if mark is None else f"newer than event {mark.event_id}"
                return Decision(Action.APPLY, event, mark=new, previous=mark, reason=why)
        raise RuntimeError(f"the high-water mark of {event.resource_id} kept changing under a locked read")
