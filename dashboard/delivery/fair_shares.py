"""Fair shares of one drain's in-flight slots between teams, then between a team's subscriptions
(docs/scheduler.md): who holds slots, whose claimed work waits here, and whether a delivery may start now.
The drain loop asks this object; it never reads the counts itself.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import NamedTuple

from dashboard.delivery.ledger import Claimed, DrainStats
from dashboard.delivery.pacing import LOCAL_CAPACITY, Pacing

# A subscription holding its team's whole share with requests this old is slow: the team's other work is popped
# and started beside it (FairShares.concentrated_teams). A healthy endpoint's requests end well before.
CONCENTRATED_SECONDS = 0.5


class Waiting(NamedTuple):
    """A claimed delivery waiting here for its subscription's turn, and the lease it holds."""
    item: Claimed
    token: str


class FairShares:
    def __init__(self, max_in_flight: int, pacing: Pacing, work, stats: DrainStats):
        self.max_in_flight = max_in_flight
        self.pacing = pacing
        self.work = work
        self.stats = stats
        self.per_subscription: Counter = Counter()  # requests in flight that hold a slot, per subscription
        self.started_at: dict[str, list[float]] = {}  # monotonic start of each request in flight, per subscription
        self.waiting: dict[str, deque[Waiting]] = {}  # per saturated subscription
        self.waiting_total = 0
        # Slots held and deliveries waiting here, per team; the teams with work waiting (here or in Redis)
        # and those active (waiting or holding slots), per refresh.
        self.slots = 0  # requests in flight that hold a slot (not those waiting for a rate limit's turn)
        self.team_slots: Counter = Counter()
        self.team_waiting: Counter = Counter()
        self.team_waiting_subs: Counter = Counter()  # per team, its subscriptions with deliveries waiting here
        self.team_of: dict[str, str] = {}  # the team of each subscription that has had a request in flight here
        self.beside: set[str] = set()  # teams held by one slow subscription, as last found (concentrated_teams)
        self.arriving_subs: dict[str, int] = {}  # per team, the subscriptions of the claim being taken not waiting here
        self.wanting: frozenset = frozenset()
        self.active: frozenset = frozenset()
        self.closing_at: float | None = None  # past its budget: only requests expected to end by then start

    def refresh(self, arriving: frozenset = frozenset()) -> bool:
        """Read who wants slots now (and the teams of `arriving` work); True if that changed (waiting
        work may start, or must wait)."""
        wanting = frozenset(self.team_waiting) | self.work.waiting_teams | arriving
        active = wanting | frozenset(self.team_slots)
        changed = wanting != self.wanting or active != self.active
        self.wanting, self.active = wanting, active
        return changed

    def share(self, team: str) -> int:
        """A team's fair share of the worker's slots: an equal part among the active teams."""
        return max(1, self.max_in_flight // (len(self.active) + (team not in self.active)))

    def least_share(self) -> int:
        """The share a newcomer team would get: no team is full below it."""
        return self.max_in_flight // (len(self.active) + 1)

    def oldest_start(self, subscription_id: str) -> float | None:
        """When this subscription's oldest request in flight here started (monotonic), None if none is."""
        starts = self.started_at.get(subscription_id)
        return min(starts) if starts else None

    def may_start(self, item: Claimed) -> bool:
        """Within its subscription's cap, a team starts a request while it holds less than its share
        (even past the worker's slots: they are held by a team over its share, whose requests end by
        their timeout; twice the slots is the hard bound), or, past its share, on a slot no other
        team is waiting for."""
        team, sub = item.team_id, item.subscription_id
        held = self.per_subscription[sub]
        if held >= self.pacing.cap(sub):
            return False
        if self.closing_at is not None:
            # Past the budget, known-slow work is handed back at the end. Work this worker has not timed yet
            # starts (its timeout bounds it): refused, a newcomer's first delivery waited out the whole grace.
            expected = self.pacing.average.get(sub)
            if expected is not None and expected >= self.closing_at - time.monotonic():
                return False
        share = self.share(team)
        # Within the team, the same again between its subscriptions that want slots (its consumers' endpoints).
        # Its own subscription is counted once: waiting here, or arriving in the claim being taken.
        others = self.team_waiting_subs.get(team, 0) + self.arriving_subs.get(team, 0) - 1
        part = max(1, share // (others + 1))
        # A subscription under its part of its team's share starts as a newcomer team would, even while another
        # subscription of its team holds the whole share with slow requests: one consumer's slow endpoint never
        # holds back another's.
        if self.team_slots.get(team, 0) < share or (others > 0 and held < part and team in self.beside):
            if self.slots >= 2 * self.max_in_flight:
                return False
        elif not (self.slots < self.max_in_flight and len(self.wanting) == (team in self.wanting)):
            return False
        return others <= 0 or held < part

    def concentrated_teams(self) -> set[str]:
        """Teams whose whole share of the slots one slow subscription holds (its oldest request in flight for
        CONCENTRATED_SECONDS). Their other subscriptions' work may start beside it (may_start), so it is popped
        from Redis every BESIDE_POP_SECONDS (the loop's), and the slow one's handed back (admit)."""
        top: dict[str, tuple[int, str]] = {}  # per team: its busiest subscription's requests in flight, and it
        for sub, held in self.per_subscription.items():
            if held > 0:
                team = self.team_of[sub]
                most, _ = top.get(team, (0, ""))
                if held > most:
                    top[team] = held, sub
        if not top:
            return set()
        slow_since = time.monotonic() - CONCENTRATED_SECONDS
        return {team for team, (held, sub) in top.items()
                if held >= self.share(team) and min(self.started_at[sub]) < slow_since}

    def full_teams(self) -> list[str]:
        """Teams this drain can start nothing more for, or holds enough work of already: a pop leaves
        their work in Redis, so that room here goes to the other teams."""
        full = []
        for team in self.team_slots.keys() | self.team_waiting.keys():
            share = self.share(team)
            load = self.team_slots.get(team, 0) + self.team_waiting.get(team, 0)
            if load >= LOCAL_CAPACITY * share or (
                    self.team_slots.get(team, 0) >= share
                    and not (self.slots < self.max_in_flight and len(self.wanting) == (team in self.wanting))):
                full.append(team)
        return full

    # -- slots held ---------------------------------------------------------------------
    def started(self, item: Claimed, began: float) -> None:
        """A request that holds a slot went out (at monotonic `began`)."""
        sub, team = item.subscription_id, item.team_id
        self.per_subscription[sub] += 1
        self.team_of[sub] = team
        self.started_at.setdefault(sub, []).append(began)
        self.slots += 1
        held = self.team_slots[team] = self.team_slots.get(team, 0) + 1
        stats = self.stats
        if self.slots > stats.peak_in_flight:
            stats.peak_in_flight = self.slots
        if held > stats.peak_by_team[team]:
            stats.peak_by_team[team] = held
        if len(self.wanting) > (team in self.wanting) and held > stats.peak_shared_by_team[team]:
            stats.peak_shared_by_team[team] = held

    def ended(self, item: Claimed, began: float) -> None:
        """A request that held a slot (started at monotonic `began`) has ended."""
        sub, team = item.subscription_id, item.team_id
        self.per_subscription[sub] -= 1
        self.started_at[sub].remove(began)
        self.slots -= 1
        held = self.team_slots[team] - 1
        if held:
            self.team_slots[team] = held
        else:
            del self.team_slots[team]

    # -- work waiting here ----------------------------------------------------------------
    def wait(self, item: Claimed, token: str) -> None:
        """A claimed delivery waits here for its subscription's turn."""
        queue = self.waiting.get(item.subscription_id)
        if not queue:
            queue = self.waiting[item.subscription_id] = deque()
            self.team_waiting_subs[item.team_id] += 1
            if item.team_id in self.arriving_subs:  # no longer arriving: counted as waiting from now on
                self.arriving_subs[item.team_id] -= 1
        queue.append(Waiting(item, token))
        self.waiting_total += 1
        self.team_waiting[item.team_id] += 1

    def next_of(self, queue: deque[Waiting]) -> Waiting:
        """The first of one subscription's waiting deliveries, taken to start."""
        waiting = queue.popleft()
        self.waiting_total -= 1
        self._unwait(waiting.item)
        return waiting

    def trim(self, subscription_id: str, keep: int) -> list[Waiting]:
        """The subscription's waiting deliveries beyond the first `keep`, taken to be handed back (newest first)."""
        queue = self.waiting[subscription_id]
        taken = []
        while len(queue) > keep:
            waiting = queue.pop()
            self._unwait(waiting.item)
            taken.append(waiting)
        self.waiting_total -= len(taken)
        return taken

    def drop_waiting(self) -> list[Waiting]:
        """Every delivery waiting here, taken (a failed drain gives them back)."""
        taken = [waiting for queue in self.waiting.values() for waiting in queue]
        self.waiting.clear()
        self.team_waiting.clear()
        self.team_waiting_subs.clear()
        self.waiting_total = 0
        return taken

    def _unwait(self, item: Claimed) -> None:
        """One delivery of item's subscription left its waiting queue (already popped)."""
        team = item.team_id
        left = self.team_waiting[team] - 1
        if left > 0:
            self.team_waiting[team] = left
        else:
            del self.team_waiting[team]
        if not self.waiting[item.subscription_id]:
            del self.waiting[item.subscription_id]
            subs = self.team_waiting_subs[team] - 1
            if subs > 0:
                self.team_waiting_subs[team] = subs
            else:
                del self.team_waiting_subs[team]
