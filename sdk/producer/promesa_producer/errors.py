"""What can go wrong when publishing, as exception types a producer can catch one by one."""

from __future__ import annotations

import re

_INDEX = re.compile(r"^events\[(\d+)\]: ")


class PromesaError(Exception):
    """Every error this package raises."""

    def __init__(self, message: str, *, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.published: list = []  # publish_many / flush: what the service accepted before this error
        self.ids: list[str] = []  # Unavailable without a spool: the ids to publish again with, so no duplicate


class Rejected(PromesaError):
    """The service refused the request with an answer that sending it again will not change (a 4xx, mostly).

    `error` is the service's own message (`{"error": ...}`); `index`, for a batch, is the position of
    the event it names in the list given to `publish_many`, else None."""

    def __init__(self, status: int, error: str, *, index: int | None = None):
        super().__init__(f"{status}: {error}", status=status)
        self.error = error
        self.index = index

    @classmethod
    def from_answer(cls, status: int, error: str, offset: int = 0) -> Rejected:
        """The error for an answer; a batch's `events[i]: ` prefix becomes `index` (shifted by `offset`)."""
        kind = AuthError if status in (401, 403) else cls
        found = _INDEX.match(error)
        if found is None:
            return kind(status, error)
        return kind(status, error, index=int(found.group(1)) + offset)


class AuthError(Rejected):
    """401 or 403: the token is missing, wrong, revoked or not allowed to publish."""


class Unavailable(PromesaError):
    """The service could not be reached, or kept answering 'not now', through every retry.

    `attempts`: how many requests were made; `cause`: the last status code or error seen."""

    def __init__(self, message: str, *, attempts: int, status: int | None = None, cause: str = ""):
        super().__init__(message, status=status)
        self.attempts = attempts
        self.cause = cause
