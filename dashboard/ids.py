"""Public identifiers: a short prefix that says what the thing is, then a ULID (time-ordered)."""

from ulid import ULID


def new_id(prefix: str) -> str:
    return f"{prefix}_{ULID()}"
