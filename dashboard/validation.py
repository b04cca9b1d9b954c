"""Client errors shared by the API and the services behind it: say what is wrong, store nothing."""

from __future__ import annotations

import re

TYPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")


class ApiError(Exception):
    """A client error with the HTTP status that says what kind it is."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def check_fields(payload, allowed: set[str], required: set[str] = frozenset()) -> dict:
    if not isinstance(payload, dict):
        raise ApiError(400, "the body must be a JSON object")
    if payload.keys() <= allowed and payload.keys() >= required:  # the usual case, without building sets
        return payload
    unknown = sorted(set(payload) - allowed)
    if unknown:
        raise ApiError(400, f"unknown field(s): {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    missing = sorted(required - set(payload))
    if missing:
        raise ApiError(400, f"missing required field(s): {', '.join(missing)}")
    return payload
