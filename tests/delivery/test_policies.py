"""Retry schedules and status rules, on a seeded random source and a given time (no sleeping)."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from dashboard.delivery.policies import ExponentialPolicy, Outcome, QuickThenSweepPolicy, decide

T0 = dt.datetime(2026, 11, 29, 18, 0, 0)
NOMINAL = {2: 30, 3: 120, 4: 480, 5: 1920, 6: 7680, 7: 30720, 8: 86400}  # the 8th is capped at 24 h


@pytest.mark.parametrize("attempt, nominal", sorted(NOMINAL.items()))
def test_exponential_delays_stay_within_equal_jitter_bounds(attempt, nominal):
    policy, rng = ExponentialPolicy(), random.Random(attempt)
    delays = [policy.delay(attempt, rng) for _ in range(2000)]
    assert all(nominal / 2 <= d <= nominal for d in delays)
    # the jitter really spreads retries over the whole window, not a fixed point
    assert min(delays) < nominal * 0.52 and max(delays) > nominal * 0.98


def test_the_whole_exponential_schedule_spans_about_a_day_and_a_half():
    policy = ExponentialPolicy()
    longest = sum(hi for _, _, hi in policy.schedule())
    shortest = sum(lo for _, lo, _ in policy.schedule())
    assert dt.timedelta(seconds=longest) == dt.timedelta(days=1, hours=11, minutes=22, seconds=30)
    assert shortest == longest / 2
    assert len(policy.schedule()) == 8


def test_exponential_dead_letters_after_the_eighth_attempt():
    policy, rng = ExponentialPolicy(), random.Random(1)
    assert decide(policy, Outcome(status_code=500), 7, T0, T0, rng).state == "scheduled"
    assert decide(policy, Outcome(status_code=500), 8, T0, T0, rng).state == "dead"
    assert decide(policy, Outcome(error="timeout"), 8, T0, T0, rng).state == "dead"


@pytest.mark.parametrize("outcome, attempts, state", [
    (Outcome(status_code=200), 1, "succeeded"),
    (Outcome(status_code=204), 5, "succeeded"),
    (Outcome(status_code=302, error="redirect not followed"), 1, "scheduled"),
    (Outcome(status_code=400), 1, "scheduled"),
    (Outcome(status_code=400), 2, "scheduled"),
    (Outcome(status_code=404), 3, "dead"),
    (Outcome(status_code=410), 1, "held"),
    (Outcome(status_code=429), 3, "scheduled"),  # rate limiting is not a client error
    (Outcome(status_code=408), 3, "scheduled"),  # nor is a request timeout
    (Outcome(status_code=500), 3, "scheduled"),
    (Outcome(error="connection error: refused"), 3, "scheduled"),
])
def test_status_rules(outcome, attempts, state):
    assert decide(ExponentialPolicy(), outcome, attempts, T0, T0, random.Random(0)).state == state


def test_410_disables_the_subscription():
    decision = decide(ExponentialPolicy(), Outcome(status_code=410), 1, T0, T0, random.Random(0))
    assert decision.disable_subscription and "410" in decision.disable_subscription


def test_retry_after_is_honoured_but_never_past_the_cap():
    policy, rng = ExponentialPolicy(), random.Random(0)
    later = decide(policy, Outcome(status_code=429, retry_after_seconds=3600), 1, T0, T0, rng)
    assert later.next_attempt_at == T0 + dt.timedelta(seconds=3600)
    sooner = decide(policy, Outcome(status_code=429, retry_after_seconds=1), 1, T0, T0, rng)
    assert dt.timedelta(seconds=15) <= sooner.next_attempt_at - T0 <= dt.timedelta(seconds=30)
    capped = decide(policy, Outcome(status_code=429, retry_after_seconds=10 ** 9), 1, T0, T0, rng)
    assert capped.next_attempt_at == T0 + dt.timedelta(hours=24)


def test_quick_then_sweep_schedule():
    policy, rng = QuickThenSweepPolicy(max_age_seconds=3600), random.Random(0)
    out = Outcome(status_code=503)
    assert decide(policy, out, 1, T0, T0, rng).next_attempt_at == T0 + dt.timedelta(seconds=0.5)
    assert decide(policy, out, 2, T0, T0, rng).next_attempt_at == T0 + dt.timedelta(seconds=0.5)
    assert decide(policy, out, 3, T0, T0, rng).next_attempt_at == T0 + dt.timedelta(seconds=60)
    now = T0 + dt.timedelta(minutes=30)
    assert decide(policy, out, 20, T0, now, rng).next_attempt_at == now + dt.timedelta(seconds=60)
    # older than its maximum age by the next sweep: dead
    assert decide(policy, out, 60, T0, T0 + dt.timedelta(minutes=59, seconds=30), rng).state == "dead"
