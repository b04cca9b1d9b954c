"""A local SQLite file that keeps the events a client could not hand over, until `flush()` sends them.

Every change is one SQLite transaction, so two clients (threads or processes) may share one file:
a flusher claims rows for a lease before sending them, so no two flushers send the same row at
once, and a row is deleted only after the service answered 2xx for it. A flusher that dies leaves
its claim to expire; the next one sends those rows again, which the event ids make harmless."""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from .errors import PromesaError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS spooled_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL,
    event TEXT NOT NULL,
    spooled_at REAL NOT NULL,
    claimed_until REAL NOT NULL DEFAULT 0,
    claimed_by TEXT,
    rejected TEXT
)
"""


class SpoolError(PromesaError):
    """The spool file could not be read or written (the event is NOT kept)."""


@dataclass(frozen=True)
class SpooledEvent:
    seq: int
    id: str
    event: dict
    spooled_at: float
    rejected: str | None = None


class Spool:
    def __init__(self, path, *, clock: Callable[[], float] = time.time, lease_seconds: float = 300.0):
        self.path = str(path)
        self.clock = clock
        self.lease_seconds = lease_seconds
        self.owner = uuid.uuid4().hex  # names this object's claims, so it removes only what it claimed
        try:
            _create_private(self.path)
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=WAL")  # outside a transaction: WAL cannot be set inside one
                conn.execute(_SCHEMA)
            finally:
                conn.close()
        except (sqlite3.Error, OSError) as exc:
            raise SpoolError(f"cannot open the spool {self.path!r}: {exc}") from exc

    def _connect(self) -> _Transaction:
        return _Transaction(self.path)

    def add(self, events: list[dict]) -> None:
        """Keep `events` (each with its id), in this order, in one transaction."""
        now = self.clock()
        with self._connect() as conn:
            conn.executemany("INSERT INTO spooled_events (id, event, spooled_at) VALUES (?, ?, ?)",
                             [(e["id"], json.dumps(e, separators=(",", ":")), now) for e in events])

    def claim(self, limit: int) -> list[SpooledEvent]:
        """The oldest rows nobody holds (and not rejected), held by this spool for its lease."""
        now = self.clock()
        with self._connect() as conn:
            rows = conn.execute("SELECT seq, id, event, spooled_at FROM spooled_events WHERE rejected IS NULL "
                                "AND claimed_until <= ? ORDER BY seq LIMIT ?", (now, limit)).fetchall()
            conn.executemany("UPDATE spooled_events SET claimed_until = ?, claimed_by = ? WHERE seq = ?",
                             [(now + self.lease_seconds, self.owner, r[0]) for r in rows])
        return [SpooledEvent(seq, id_, json.loads(event), at) for seq, id_, event, at in rows]

    def remove(self, seqs: list[int]) -> None:
        """Forget rows the service accepted (only while this spool still holds them)."""
        with self._connect() as conn:
            conn.executemany("DELETE FROM spooled_events WHERE seq = ? AND claimed_by = ?",
                             [(s, self.owner) for s in seqs])

    def release(self, seqs: list[int]) -> None:
        with self._connect() as conn:
            conn.executemany("UPDATE spooled_events SET claimed_until = 0, claimed_by = NULL "
                             "WHERE seq = ? AND claimed_by = ?", [(s, self.owner) for s in seqs])

    def reject(self, seq: int, error: str) -> None:
        """Keep a row the service refused for good, with its reason, out of every later flush."""
        with self._connect() as conn:
            conn.execute("UPDATE spooled_events SET rejected = ?, claimed_until = 0, claimed_by = NULL "
                         "WHERE seq = ? AND claimed_by = ?", (error, seq, self.owner))

    def pending(self) -> int:
        """How many rows wait to be sent (rejected ones not counted)."""
        with self._connect() as conn:
            return conn.execute("SELECT count(*) FROM spooled_events WHERE rejected IS NULL").fetchone()[0]

    def rejected(self) -> list[SpooledEvent]:
        """The rows the service refused for good, oldest first: fix and publish them again, then `discard`."""
        with self._connect() as conn:
            rows = conn.execute("SELECT seq, id, event, spooled_at, rejected FROM spooled_events "
                                "WHERE rejected IS NOT NULL ORDER BY seq").fetchall()
        return [SpooledEvent(seq, id_, json.loads(event), at, why) for seq, id_, event, at, why in rows]

    def discard(self, seq: int) -> None:
        with self._connect() as conn:
            conn.execute("DELETE FROM spooled_events WHERE seq = ? AND rejected IS NOT NULL", (seq,))


def _create_private(path: str) -> None:
    """Create the spool file readable and writable by its owner alone (0600) before SQLite opens it: events are
    the producer's data, and SQLite gives its -wal and -shm files the database file's mode."""
    if path == ":memory:" or path.startswith("file:"):
        return
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))  # an existing file is left as its owner set it


class _Transaction:
    """One connection and one immediate transaction: commit on success, roll back on error, close always."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self) -> sqlite3.Connection:
        try:
            self.conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            self.conn.execute("PRAGMA synchronous=FULL")  # a spooled event survives a power cut, not just a crash
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise SpoolError(f"cannot open the spool {self.path!r}: {exc}") from exc
        return self.conn

    def __exit__(self, kind, exc, tb):
        try:
            self.conn.execute("COMMIT" if kind is None else "ROLLBACK")
        except sqlite3.Error as err:
            if kind is None:
                raise SpoolError(f"cannot write the spool {self.path!r}: {err}") from err
        finally:
            self.conn.close()
        if isinstance(exc, sqlite3.Error):
            raise SpoolError(f"cannot use the spool {self.path!r}: {exc}") from exc
        return False
