"""Public identifiers: a short prefix that says what the thing is, then a ULID (time-ordered).

The ULIDs follow the spec's monotonic mode, as python-ulid's generator does: within one
millisecond a process counts on from its last value, so ids made here sort in the order they
were made. They are encoded here, two Crockford characters (10 bits) per table lookup, because
ingest makes several ids per event and python-ulid's encoder is several times slower per id.
"""

from __future__ import annotations

import os
import threading
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [high + low for high in _CROCKFORD for low in _CROCKFORD]  # 10 bits -> 2 characters
_SHIFTS = tuple(range(120, -1, -10))  # 13 pairs: 130 bits, the top 2 always zero
_RANDOM_BITS = 80
_RANDOM_LIMIT = 1 << _RANDOM_BITS
_lock = threading.Lock()
_last = (0, 0)  # (millisecond, random part) of the latest ULID made in this process


def _forget_last() -> None:
    global _last
    _last = (0, 0)


os.register_at_fork(after_in_child=_forget_last)  # a forked child must not count on from its parent's ids


def _random_start(count: int) -> int:
    return int.from_bytes(os.urandom(10), "big") % (_RANDOM_LIMIT - count)


def _next_ulids(count: int) -> tuple[int, int]:
    """The millisecond and the first random part of `count` consecutive ULIDs."""
    global _last
    with _lock:
        millisecond = time.time_ns() // 1_000_000
        last_millisecond, last_random = _last
        if millisecond > last_millisecond:
            first = _random_start(count)
        elif last_random + count < _RANDOM_LIMIT:  # the same millisecond (or the clock stepped back): count on
            millisecond, first = last_millisecond, last_random + 1
        else:  # the random part would overflow: take the next millisecond
            millisecond, first = last_millisecond + 1, _random_start(count)
        _last = (millisecond, first + count - 1)
    return millisecond, first


def new_ids(prefix: str, count: int) -> list[str]:
    """`count` ids with this prefix, in increasing order."""
    if count <= 0:
        return []
    millisecond, first = _next_ulids(count)
    start = (millisecond << _RANDOM_BITS) | first
    prefix += "_"
    return [prefix + "".join([_PAIRS[(value >> shift) & 1023] for shift in _SHIFTS])
            for value in range(start, start + count)]


def new_id(prefix: str) -> str:
    return new_ids(prefix, 1)[0]
