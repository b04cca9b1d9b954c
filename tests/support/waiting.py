"""Waiting for something another thread or process does, with a deadline (never a bare sleep)."""

from __future__ import annotations

import time


def wait_until(predicate, timeout: float, every: float = 0.2, on_wait=None) -> bool:
    """True as soon as `predicate()` is; False if it still is not after `timeout` seconds.
    `on_wait`: called between tries (to nudge what is awaited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if on_wait:
            on_wait()
        time.sleep(every)
    return predicate()
