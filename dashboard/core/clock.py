"""Time, injectable. Every schedule, window and lease asks a clock, never the OS directly,
so tests move time instead of sleeping through it.

All datetimes in Promesa are naive UTC (the same on SQLite and PostgreSQL).
"""

from __future__ import annotations

import datetime as dt
import threading


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class SystemClock:
    def now(self) -> dt.datetime:
        return utcnow()


class FrozenClock:
    """A clock that only moves when told to (tests)."""

    def __init__(self, start: dt.datetime | None = None):
        self._now = start or utcnow()
        self._lock = threading.Lock()

    def now(self) -> dt.datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float = 0, **kwargs) -> dt.datetime:
        with self._lock:
            self._now += dt.timedelta(seconds=seconds, **kwargs)
            return self._now

    def set(self, when: dt.datetime) -> None:
        with self._lock:
            self._now = when


def unix(when: dt.datetime) -> float:
    """Seconds since the epoch of a naive-UTC datetime."""
    return when.replace(tzinfo=dt.timezone.utc).timestamp()


def from_unix(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).replace(tzinfo=None)


def iso(when: dt.datetime | None) -> str | None:
    """ISO 8601 with milliseconds and a Z, as the thin event body carries it."""
    if when is None:
        return None
    return when.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"  # strftime's %Y writes year 1 as "1"
