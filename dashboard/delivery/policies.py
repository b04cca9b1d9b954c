"""Retry policies and the status rules of the contract.

`decide()` turns the outcome of one attempt into the delivery's next state. It is pure:
it takes the time and a random source, so schedules are tested without sleeping.
"""

from __future__ import annotations

import datetime as dt
import functools
import random
from dataclasses import dataclass

from dashboard.models import RETRY_POLICY_NAMES, DeliveryState

CLIENT_ERROR_MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class Outcome:
    """What one HTTP attempt produced: a status code, or an error class when no answer came."""

    status_code: int | None = None
    error: str | None = None
    retry_after_seconds: float | None = None

    @property
    def succeeded(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300 and self.error is None


@dataclass(frozen=True)
class Decision:
    state: str
    next_attempt_at: dt.datetime | None = None
    disable_subscription: str | None = None  # the reason, when the subscription must be disabled


class ExponentialPolicy:
    """8 attempts: immediately, then 30 s x 4^(n-2) capped at 24 h, each with equal jitter."""

    name = "exponential"
    max_attempts = 8
    base_seconds = 30.0
    factor = 4.0
    cap_seconds = 24 * 3600.0

    def nominal_delay(self, next_attempt_number: int) -> float:
        """Delay before attempt n (n >= 2), before jitter."""
        return min(self.base_seconds * self.factor ** (next_attempt_number - 2), self.cap_seconds)

    def delay(self, next_attempt_number: int, rng: random.Random) -> float:
        d = self.nominal_delay(next_attempt_number)
        return rng.uniform(d / 2, d)  # equal jitter: never sooner than half, never later than the nominal

    def next_attempt(self, attempts_made: int, schedule_started_at: dt.datetime, now: dt.datetime,
                     rng: random.Random) -> dt.datetime | None:
        if attempts_made >= self.max_attempts:
            return None
        return now + dt.timedelta(seconds=self.delay(attempts_made + 1, rng))

    def schedule(self) -> list[tuple[int, float, float]]:
        """(attempt number, shortest, longest delay before it) for the published contract."""
        rows = [(1, 0.0, 0.0)]
        for n in range(2, self.max_attempts + 1):
            d = self.nominal_delay(n)
            rows.append((n, d / 2, d))
        return rows


class QuickThenSweepPolicy:
    """Three quick attempts 0.5 s apart, then one attempt per sweep until the schedule is too old
    (counted from when the event was accepted, or from its last replay)."""

    name = "quick-then-sweep"
    quick_attempts = 3
    quick_interval_seconds = 0.5
    sweep_interval_seconds = 60.0
    cap_seconds = 24 * 3600.0

    def __init__(self, max_age_seconds: float = 24 * 3600):
        self.max_age = dt.timedelta(seconds=max_age_seconds)

    def next_attempt(self, attempts_made: int, schedule_started_at: dt.datetime, now: dt.datetime,
                     rng: random.Random) -> dt.datetime | None:
        if attempts_made < self.quick_attempts:
            when = now + dt.timedelta(seconds=self.quick_interval_seconds)
        else:
            when = now + dt.timedelta(seconds=self.sweep_interval_seconds)
        if when > schedule_started_at + self.max_age:
            return None
        return when


POLICY_NAMES = (ExponentialPolicy.name, QuickThenSweepPolicy.name)
assert POLICY_NAMES == RETRY_POLICY_NAMES, "the models name the same policies"
SUCCEEDED = Decision(DeliveryState.SUCCEEDED)


@functools.lru_cache(maxsize=256)  # policies hold no state: one per setting, not one per attempt
def policy_for(name: str, max_age_seconds: float = 24 * 3600):
    if name == QuickThenSweepPolicy.name:
        return QuickThenSweepPolicy(max_age_seconds)
    return ExponentialPolicy()


def decide(policy, outcome: Outcome, attempts_made: int, schedule_started_at: dt.datetime,
           now: dt.datetime, rng: random.Random) -> Decision:
    """The contract's STATUS line, applied to one finished attempt (attempts_made counts it)."""
    if outcome.succeeded:
        return SUCCEEDED
    code = outcome.status_code
    if code == 410:
        # Gone: stop sending, but keep the delivery (and later ones) held for a resume.
        return Decision(DeliveryState.HELD, disable_subscription="endpoint answered 410 Gone")
    # 408 and 429 say "not now", not "never": they keep the full schedule.
    if code is not None and 400 <= code < 500 and code not in (408, 429) and attempts_made >= CLIENT_ERROR_MAX_ATTEMPTS:
        return Decision(DeliveryState.DEAD)
    when = policy.next_attempt(attempts_made, schedule_started_at, now, rng)
    if when is None:
        return Decision(DeliveryState.DEAD)
    if code == 429 and outcome.retry_after_seconds:
        # Honour Retry-After, but inside the schedule: never past the policy's cap.
        wait = min(outcome.retry_after_seconds, policy.cap_seconds)
        when = max(when, now + dt.timedelta(seconds=wait))
    return Decision(DeliveryState.SCHEDULED, next_attempt_at=when)
