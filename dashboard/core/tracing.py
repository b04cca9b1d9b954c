"""Traces: the producer's W3C `traceparent` carried from ingest to every delivery attempt.

A valid traceparent on `POST /api/v1/events` is stored with the event and sent on each attempt as it came; an
invalid one is ignored, never refused (W3C Trace Context).
"""

from __future__ import annotations

import re

HEADER = "traceparent"
# version-trace id-parent id-flags, in lower-case hex (W3C Trace Context, level 1).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE, _ZERO_PARENT = "0" * 32, "0" * 16


def traceparent(value: str | None) -> str | None:
    """A traceparent header's value as stored and sent (version 00), or None for a missing or invalid one.
    A later version is read as version 00 is, as W3C asks: its first four fields, followed by "-" or nothing."""
    if not value:
        return None
    value = value.strip()
    found = _TRACEPARENT.match(value)
    if found is None:
        return None
    version, trace_id, parent_id, flags = found.groups()
    rest = value[found.end():]
    if version == "ff" or trace_id == _ZERO_TRACE or parent_id == _ZERO_PARENT:
        return None
    if version == "00":
        return value if not rest else None
    return f"00-{trace_id}-{parent_id}-{flags}" if rest[:1] in ("", "-") else None
