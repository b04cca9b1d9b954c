"""Long polling without a thread per waiting client: what a view and the server that parks it say to each other.

A view with nothing to answer yet asks to be parked (`park`). Under `promesa web` the server
(dashboard.web.parking.ParkingWorker) then keeps the connection without a thread, sends nothing, and runs the
request again when its key is announced (a push left deliveries of that subscription due), when it is due by
time (`wake_at`: a retry's time, a lease's end), or when its deadline comes; the view finds `waiting(environ)`
set then, and either answers or parks again. A server that cannot park (the tests' client, another WSGI
server) never offers to: `can_park` is false and the view answers at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# environ keys: the parking server's desk, the wait a request run again is in, and a view's request to park.
DESK = "promesa.parking"
WAITING = "promesa.waiting"
PARKED = "promesa.parked"


@dataclass(frozen=True)
class Park:
    """What a view asks of the server: wait for `key` (counted against `team`) until `deadline` (monotonic
    seconds), looking again at `wake_at` at the latest; `seen`: the key's announcements read before the view
    looked, so one that came meanwhile wakes it at once."""

    key: str
    team: str
    seen: int
    deadline: float
    wake_at: float


@dataclass(frozen=True)
class Waiting:
    """The wait a request is run again in: its deadline; `final` when it has come (answer now, even empty);
    `refused` when it could not wait at all (a limit: the view answers with this status, reason and more fields)."""

    deadline: float
    final: bool = False
    refused: tuple[int, str, dict] | None = None


class Desk:
    """The server's side: how many times each key has been announced in this process."""

    def __init__(self) -> None:
        self.announced: dict[str, int] = {}

    def seen(self, key: str) -> int:
        return self.announced.get(key, 0)


def can_park(environ) -> bool:
    return DESK in environ


def waiting(environ) -> Waiting | None:
    """The wait this request is run again in, or None on its first run."""
    return environ.get(WAITING)


def seen(environ, key: str) -> int:
    desk = environ.get(DESK)
    return desk.seen(key) if desk is not None else 0


def park(environ, key: str, team: str, seen_before: int, wait_seconds: float, wake_in: float | None) -> None:
    """Ask the server to park this request (the view then returns any response: it is never sent). A request
    run again keeps its first deadline."""
    now = time.monotonic()
    previous = waiting(environ)
    deadline = previous.deadline if previous is not None else now + wait_seconds
    wake_at = deadline if wake_in is None else min(deadline, now + max(0.0, wake_in))
    environ[PARKED] = Park(key, team, seen_before, deadline, wake_at)
