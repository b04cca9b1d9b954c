"""Pacing: how long a request to each subscription takes here, how much of its work may wait in a drain,
and the rate and in-flight limits set per subscription (dashboard.delivery.ratelimit).

A subscription with its share of requests in flight keeps a couple of seconds of work waiting in the
drain, and hands the rest back paced at the speed it answers, so a slow endpoint neither blocks the
others nor gets claimed and handed back every second. Learned per worker: it outlives each drain.
"""

from __future__ import annotations

import time

from dashboard.core.clock import unix
from dashboard.delivery.ledger import Claimed, Ledger
from dashboard.delivery.ratelimit import RateLimiter
from dashboard.queue.work import work_item

# Claimed deliveries kept in one drain (in flight + waiting for their subscription), per in-flight slot.
LOCAL_CAPACITY = 4
# A saturated subscription keeps about this many seconds of work waiting here; the rest is handed back.
WAIT_TARGET_SECONDS = 2.0
# A handed-back delivery is due again no sooner than this, and no later than the cap (so an
# endpoint that recovers gets its backlog within a minute).
SATURATED_RETRY_SECONDS = 1.0
MAX_DEFER_SECONDS = 60.0


class Pacing:
    def __init__(self, clock, work, ledger: Ledger, limiter: RateLimiter, max_in_flight: int, per_subscription: int):
        self.clock = clock
        self.work = work
        self.ledger = ledger
        self.limiter = limiter
        self.max_in_flight = max_in_flight
        self.per_subscription = per_subscription
        self.average: dict[str, float] = {}  # per subscription, how long a request takes here
        self._booked_until: dict[str, float] = {}  # per subscription, the latest deferred due time handed out
        # Learned from claims: the rate limit of each subscription that has one, and in-flight caps set per
        # subscription. Work for a subscription not in rate_limits never costs a limiter call.
        self.rate_limits: dict[str, float] = {}
        self.in_flight_caps: dict[str, int] = {}

    # -- pacing a saturated subscription ------------------------------------------------
    def expected_seconds(self, subscription_id: str, oldest_in_flight: float | None) -> float | None:
        """How long one request to this subscription takes here: the running average, or longer
        when one is already taking longer than that."""
        avg = self.average.get(subscription_id)
        if oldest_in_flight is not None:
            avg = max(avg or 0.0, time.monotonic() - oldest_in_flight)
        return avg

    def waiting_cap(self, expected: float | None) -> int:
        """How many of one subscription's claimed deliveries may wait here: about WAIT_TARGET_SECONDS of work."""
        ceiling = LOCAL_CAPACITY * self.max_in_flight
        if not expected:
            return ceiling
        return int(max(2 * self.per_subscription, min(ceiling, self.per_subscription * WAIT_TARGET_SECONDS / expected)))

    def learn(self, subscription_id: str, seconds: float) -> None:
        avg = self.average.get(subscription_id)
        self.average[subscription_id] = seconds if avg is None else 0.8 * avg + 0.2 * seconds

    def _paced(self, subscription_id: str, expected: dict[str, float | None], now_unix: float) -> float:
        """When a saturated subscription's next handed-back delivery should be due: one by one at
        the pace it answers here, from a second away to at most a minute."""
        interval = (expected.get(subscription_id) or 0.0) / self.cap(subscription_id)  # at its own in-flight cap
        when = max(now_unix + SATURATED_RETRY_SECONDS, self._booked_until.get(subscription_id, 0.0) + interval)
        when = min(when, now_unix + MAX_DEFER_SECONDS)
        self._booked_until[subscription_id] = when
        return when

    def park(self, pairs: list[tuple[str, str]], expected: dict[str, float | None]) -> None:
        """Put unclaimed (subscription, delivery) pairs back in Redis, paced. No database write:
        the row is untouched, and the sweeper leaves it alone while Redis holds it."""
        now_unix = unix(self.clock.now())
        self.work.schedule([(work_item(sub, dlv), self._paced(sub, expected, now_unix)) for sub, dlv in pairs])

    def defer_paced(self, pairs: list[tuple[Claimed, str]], expected: dict[str, float | None]) -> None:
        """Hand claimed but saturated deliveries back, due one by one at the pace their subscription
        answers here, so a slow endpoint's backlog is not claimed and handed back every second."""
        if not pairs:
            return
        now = self.clock.now()
        now_unix = unix(now)
        by_token: dict[str, list[str]] = {}
        due = []
        for item, token in pairs:
            when = self._paced(item.subscription_id, expected, now_unix)
            by_token.setdefault(token, []).append(item.delivery_id)
            due.append((work_item(item.subscription_id, item.delivery_id), when))
        # One UPDATE per claim: the database gets the earliest due time; Redis holds each one's paced time.
        self.ledger.hand_back(by_token, now_unix + SATURATED_RETRY_SECONDS, now)
        self.work.schedule(due)

    # -- per-subscription limits (dashboard.delivery.ratelimit) ------------------------------
    def cap(self, subscription_id: str) -> int:
        """Requests in flight to this subscription allowed in this worker."""
        return self.in_flight_caps.get(subscription_id) or self.per_subscription

    def learn_limits(self, items: list[Claimed]) -> None:
        for item in items:
            sub = item.subscription_id
            if item.rate_limit_per_s:
                self.rate_limits[sub] = item.rate_limit_per_s
            elif sub in self.rate_limits:
                del self.rate_limits[sub]
            if item.max_in_flight:
                self.in_flight_caps[sub] = item.max_in_flight
            elif sub in self.in_flight_caps:
                del self.in_flight_caps[sub]

    def throttle_unclaimed(self, limited: dict[str, list[str]]) -> tuple[list[str], int]:
        """Delivery ids of rate-limited subscriptions, before any claim: those the limiter would let go now
        (it only looks: the turn is taken just before sending), and how many went back to Redis to wait
        their turn (no database write: their rows stay due)."""
        now = unix(self.clock.now())
        go, wait = self.limiter.split({sub: (self.rate_limits[sub], [(sub, i) for i in ids])
                                       for sub, ids in limited.items()}, now, consume=False)
        self.work.schedule([(work_item(sub, delivery_id), when) for (sub, delivery_id), when in wait])
        return [delivery_id for (_, delivery_id), _ in go], len(wait)

    def throttle_claimed(self, limited: dict[str, list[Claimed]], token: str) -> set[str]:
        """Claimed deliveries of rate-limited subscriptions take their turns, just before they are sent
        (so a slow claim cannot bunch them up). Those over the rate (another worker took the turn, or the
        first claim of the subscription) are handed back: lease released, due when the limiter says.
        Returns their ids."""
        now = self.clock.now()
        go, wait = self.limiter.split({sub: (items[0].rate_limit_per_s, items) for sub, items in limited.items()},
                                      unix(now))
        for item, turn in go:
            item.turn = turn
        if not wait:
            return set()
        ids = [item.delivery_id for item, _ in wait]
        # Due from the earliest turn; Redis holds each one's own.
        self.ledger.hand_back({token: ids}, min(when for _, when in wait), now, retry=False)
        self.work.schedule([(work_item(item.subscription_id, item.delivery_id), when) for item, when in wait])
        return set(ids)

    def retake(self, item: Claimed) -> tuple[bool, float]:
        """A fresh turn for a request that missed its own: (got one, seconds until it, or until asking again:
        never long, it holds its lease meanwhile)."""
        now = unix(self.clock.now())
        got, first, next_at = self.limiter.admit({item.subscription_id: (item.rate_limit_per_s, 1)}, now)[
            item.subscription_id]
        return (True, first - now) if got else (False, min(next_at - now, max(self.limiter.lookahead, 0.05)))
