"""Writing events and their deliveries: ingest's and the system's own (dashboard.operations.notifications) go
through the same rows, the same thin body and the same statements.

On PostgreSQL (psycopg) rows go in one `INSERT ... SELECT FROM unnest()` of one array per column, built
once per shape; elsewhere an executemany.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
from typing import NamedTuple

from sqlalchemy import String, Table, bindparam, insert, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import DBAPIError

from dashboard.core.extensions import db
from dashboard.core.ids import new_ids
from dashboard.ingest import autocommit
from dashboard.ingest.routing_cache import STILL_CURRENT, ReadAgain
from dashboard.models import Delivery, DeliveryState, Event
from dashboard.queue.work import work_item

log = logging.getLogger(__name__)

_EVENT_KEY = select(Event.key).where(Event.key == bindparam("key"))

_json_str = json.encoder.encode_basestring_ascii  # how json.dumps writes a string (ensure_ascii)


def thin_body(event_id: str, event_type: str, version: int, timestamp: str, data_json: str) -> str:
    """The same text as json.dumps({"id", "type", "version", "timestamp", "data"}, separators=(",", ":")),
    around the data JSON that validation already made."""
    return (f'{{"id":{_json_str(event_id)},"type":{_json_str(event_type)},"version":{version},'
            f'"timestamp":{_json_str(timestamp)},"data":{data_json}}}')


class Promised(NamedTuple):
    """A delivery to store: of this event (its key), to this subscription; active: pending, else held."""
    event_key: str
    subscription_id: str
    active: bool


def delivery_rows(promised: list[Promised]) -> tuple[list[dict], list[str]]:
    """The delivery rows of these promises, and the work items of those due now (the active ones), for the
    queue once they are committed."""
    rows, ready = [], []
    for (event_key, subscription_id, active), delivery_id in zip(promised, new_ids("dlv", len(promised))):
        rows.append({"id": delivery_id, "event_key": event_key, "subscription_id": subscription_id,
                     "state": DeliveryState.PENDING if active else DeliveryState.HELD})
        if active:
            ready.append(work_item(subscription_id, delivery_id))
    return rows, ready


def new_delivery_values(now: dt.datetime) -> dict:
    """What every new delivery row holds alike: no attempt yet, due now."""
    return {"attempt_count": 0, "retry_base": 0, "next_attempt_at": now, "created_at": now, "updated_at": now}


def _how_to_send(table: Table, name: str, dialect):
    """A column's bind processor (None, or e.g. dict -> psycopg Json) and the SQL type to cast its value to.
    Strings are cast to unbounded VARCHAR, so that a value too long for its column fails as in a plain
    INSERT (a cast to VARCHAR(n) would cut it short)."""
    kind = table.c[name].type.dialect_impl(dialect)
    return kind.bind_processor(dialect), String() if isinstance(kind, String) else kind


class _InsertPlan(NamedTuple):
    """A one-statement INSERT and how to send its values: the values every row shares come first, then
    one array per column (INSERT ... SELECT FROM unnest), or, for a single row, one value per column;
    last, when `guarded`, the routing generation the rows were planned at (routing_cache)."""
    sql: str
    row_processors: list
    same_processors: list
    one_row: bool
    guarded: bool


@functools.lru_cache(maxsize=64)
def _insert_plan(table: Table, row_names: tuple[str, ...], same_names: tuple[str, ...], dialect,
                 one_row: bool, guarded: bool = False) -> _InsertPlan | None:
    """Built once per table, columns, shape and guard. None when a column with a Python-side default is
    missing (the executemany fills it in per row). `guarded`: rows are written only while the routing
    generation is still the one given last."""
    if any(c.default is not None and c.name not in (*row_names, *same_names) for c in table.c):
        return None
    row_processors, row_sql, same_processors, same_sql = [], [], [], []
    for name in row_names:
        process, sql_type = _how_to_send(table, name, dialect)
        row_processors.append(process)
        row_sql.append(f"%b::{(sql_type if one_row else ARRAY(sql_type)).compile(dialect=dialect)}")
    for name in same_names:
        process, sql_type = _how_to_send(table, name, dialect)
        same_processors.append(process)
        same_sql.append(f"%b::{sql_type.compile(dialect=dialect)}")
    quote = dialect.identifier_preparer.quote
    columns = ", ".join(quote(n) for n in (*same_names, *row_names))
    if one_row:
        # psycopg dumps an array at several times a value's cost, and a single event is one row of each table.
        values = ', '.join([*same_sql, *row_sql])
        sql = f"INSERT INTO {quote(table.name)} ({columns}) " + \
            (f"SELECT {values}{STILL_CURRENT}" if guarded else f"VALUES ({values})")
    else:
        sql = (f"INSERT INTO {quote(table.name)} ({columns}) "
               f"SELECT {', '.join([*same_sql, 'given.*'])} FROM unnest({', '.join(row_sql)}) AS given"
               + (STILL_CURRENT if guarded else ""))
    return _InsertPlan(sql, row_processors, same_processors, one_row, guarded)


def _plan_for(table: Table, rows: list[dict], same: dict, guarded: bool = False) -> _InsertPlan | None:
    dialect = db.engine.dialect
    if (dialect.name, dialect.driver) == ("postgresql", "psycopg"):
        return _insert_plan(table, tuple(rows[0]), tuple(same), dialect, len(rows) == 1, guarded)
    return None


def _sent(values, processors) -> list:
    return [process(value) if process else value for value, process in zip(values, processors)]


def _insert_parameters(plan: _InsertPlan, rows: list[dict], same: dict, generation: int | None = None) -> tuple:
    guard = (generation,) if plan.guarded else ()
    if plan.one_row:
        return (*_sent(same.values(), plan.same_processors), *_sent(rows[0].values(), plan.row_processors), *guard)
    arrays = [[process(row[name]) for row in rows] if process else [row[name] for row in rows]
              for name, process in zip(rows[0], plan.row_processors)]
    return (*_sent(same.values(), plan.same_processors), *arrays, *guard)


def insert_rows(table: Table, rows: list[dict], same: dict) -> None:
    """INSERT rows (dicts with the same keys), each with the values in `same` too: one statement on
    PostgreSQL (psycopg), an executemany elsewhere."""
    plan = _plan_for(table, rows, same)
    if plan is None:
        autocommit.connection().execute(insert(table), [row | same for row in rows])
        return
    # An executemany is one INSERT per row, and that per-row work (SQLAlchemy, psycopg, the protocol, the
    # executor) dominates a batch, here and in PostgreSQL. Instead: INSERT ... SELECT FROM
    # unnest() of one array per column (one value per column for a single row), in psycopg's binary format
    # (%b: no text quoting of each element); the values every row shares are sent once.
    autocommit.write(plan.sql, _insert_parameters(plan, rows, same))


def insert_events(events: list[dict], events_same: dict, deliveries: list[dict], deliveries_same: dict,
                  generation: int | None = None) -> None:
    """Store events and their deliveries. On PostgreSQL one statement does both (the events' INSERT in a
    WITH): one round trip, and atomic on its own, so ingest needs no transaction around it (ingest.autocommit).
    `generation`: the routing generation they were planned at (PostgreSQL); if it has moved on, nothing is
    stored and ReadAgain is raised."""
    guarded = generation is not None
    plans = [_plan_for(Event.__table__, events, events_same, guarded)]
    if deliveries:
        plans.append(_plan_for(Delivery.__table__, deliveries, deliveries_same, guarded))
    if None in plans:
        if guarded:  # (every column is given, so not expected) unguarded, it could store what was routed stale
            raise ReadAgain(changed=False)
        insert_rows(Event.__table__, events, events_same)
        if deliveries:
            insert_rows(Delivery.__table__, deliveries, deliveries_same)
        return
    if len(plans) == 1:
        written = autocommit.write(plans[0].sql, _insert_parameters(plans[0], events, events_same, generation))
    else:  # both statements see the same generation: both write, or neither does
        written = autocommit.write(f"WITH stored_events AS ({plans[0].sql}) {plans[1].sql}",
                                    (*_insert_parameters(plans[0], events, events_same, generation),
                                     *_insert_parameters(plans[1], deliveries, deliveries_same, generation)))
    if guarded and written == 0:
        raise ReadAgain(changed=True)


def store_once(events: list[dict], events_same: dict, deliveries: list[dict], deliveries_same: dict,
               generation: int | None = None) -> None:
    """insert_events and commit, exactly once even when the connection dies under the write.

    Whether a write whose connection was lost (a backend terminated, a failover) was stored is
    unknown to the client: the statement may have committed (in autocommit it commits as it runs)
    or not. The keys were made before the write, so a look on a new connection tells which, and
    the write runs again only if nothing was stored."""
    def write():
        insert_events(events, events_same, deliveries, deliveries_same, generation)
        autocommit.commit()

    try:
        write()
    except DBAPIError as error:
        if not error.connection_invalidated:
            raise
        autocommit.discard()
        stored = bool(autocommit.read(_EVENT_KEY, {"key": events[0]["key"]}))
        log.warning("ingest: the database connection was lost under the write (%s); %s", type(error.orig).__name__,
                    "it had been stored" if stored else "writing it again on a new connection")
        if not stored:
            write()
