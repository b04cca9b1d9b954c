"""Per-endpoint rate limits, enforced across all workers on all machines: GCRA (the generic cell rate
algorithm, a token bucket kept as one timestamp) in a Lua script on the shared Redis.

A throttled delivery waits its turn. It is not an attempt and not a failure, and does not count in
the retry schedule: its row stays in the database as it was (due), and its work item goes back to
Redis's scheduled set at the time the limiter names, so nothing is lost if a worker dies while it
waits (the sweeper finds a due row that Redis no longer holds). Replays go through the same drain,
so they obey the limit too.

The engine asks only for subscriptions that have a limit: an endpoint without one costs no Redis call.
Times are the engine's injected clock (unix seconds); workers' clocks must agree (NTP), as signature
timestamps already require.
"""

from __future__ import annotations

import asyncio
import time

import redis

# After an idle spell an endpoint may get this much of a burst (seconds of its rate, at least one delivery);
# while a backlog drains, the rate is exact.
TOLERANCE_SECONDS = 0.02
# A throttled delivery is handed back at most this far ahead; one due later comes back then and asks again
# (so a raised limit takes effect within a minute).
MAX_WAIT_SECONDS = 60.0

# KEYS[1]: the endpoint's theoretical arrival time (TAT): when its next turn is.
# ARGV: now, interval (1/rate), tolerance, wanted, lookahead, consume (1: reserve the turns; 0: only look).
# Gives as many of `wanted` deliveries a turn as fall within `lookahead` seconds (plus the tolerance),
# one interval apart, and answers {how many, the first turn, when the next could be given one}.
_GCRA = """
local now = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local tolerance = tonumber(ARGV[3])
local wanted = tonumber(ARGV[4])
local lookahead = tonumber(ARGV[5])
local consume = ARGV[6] == '1'
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local first = tat
local admitted = 0
while admitted < wanted and tat - tolerance - lookahead <= now do
  tat = tat + interval
  admitted = admitted + 1
end
if admitted > 0 and consume then
  redis.call('SET', KEYS[1], string.format('%.6f', tat), 'PX', math.ceil((tat - now) * 1000) + 1000)
end
local next_at = tat - tolerance - lookahead
if next_at < now then next_at = now end
return {admitted, string.format('%.6f', first), string.format('%.6f', next_at)}
"""


class RateLimiter:
    """One per engine: the shared script, and when this worker last booked each endpoint's next turn."""

    def __init__(self, conn, prefix: str, lookahead: float = 0.0):
        self.conn = conn
        self.prefix = prefix
        # A worker reserves turns up to this far ahead and waits for them itself, so its work does not
        # depend on the promoter's tick to come back exactly on time.
        self.lookahead = lookahead
        self._script = conn.register_script(_GCRA)
        self._booked_until: dict[str, float] = {}

    def key(self, subscription_id: str) -> str:
        return f"{self.prefix}:rate:{subscription_id}"

    def admit(self, wanted: dict[str, tuple[float, int]], now: float,
              consume: bool = True) -> dict[str, tuple[int, float, float]]:
        """{subscription: (rate per second, how many want to go)} -> {subscription: (how many get a turn,
        the first turn, when the next could get one)}: one round trip for all of them. The turns are one
        interval apart from the first. consume=False only looks (reserves nothing)."""
        def ask():
            # EVALSHA by hand: a pipeline given the Script object asks SCRIPT EXISTS first, a round trip per call.
            pipe = self.conn.pipeline(transaction=False)
            for subscription_id, (rate, count) in wanted.items():
                pipe.evalsha(self._script.sha, 1, self.key(subscription_id),
                             now, 1.0 / rate, TOLERANCE_SECONDS, count, self.lookahead, int(consume))
            return pipe.execute()

        try:
            answers = ask()
        except redis.exceptions.NoScriptError:  # Redis lost its scripts (restarted, flushed): none of them ran
            self.conn.script_load(_GCRA)
            answers = ask()
        return {sub: (int(admitted), float(first), float(next_at)) for sub, (admitted, first, next_at)
                in zip(wanted, answers)}

    def turns(self, subscription_id: str, rate: float, count: int, next_at: float, now: float) -> list[float]:
        """When each of `count` throttled deliveries should come back: one per interval from the limiter's
        next turn (after those this worker already handed back), at most MAX_WAIT_SECONDS ahead."""
        interval = 1.0 / rate
        start = max(next_at, self._booked_until.get(subscription_id, 0.0) + interval)
        horizon = now + MAX_WAIT_SECONDS
        out = [min(start + i * interval, horizon) for i in range(count)]
        if out:
            self._booked_until[subscription_id] = out[-1]
        return out

    def split(self, limited: dict[str, tuple[float, list]], now: float,
              consume: bool = True) -> tuple[list[tuple[object, float]], list[tuple[object, float]]]:
        """{subscription: (rate, [things])} -> ([(thing, its turn)] for those that get one within the
        lookahead, [(thing, when to come back and ask again)] for the others)."""
        answers = self.admit({sub: (rate, len(things)) for sub, (rate, things) in limited.items()}, now, consume)
        go, wait = [], []
        for sub, (rate, things) in limited.items():
            admitted, first, next_at = answers[sub]
            go.extend((thing, first + i / rate) for i, thing in enumerate(things[:admitted]))
            wait.extend(zip(things[admitted:], self.turns(sub, rate, len(things) - admitted, next_at, now)))
        return go, wait


# A request that leaves later than this after its turn (a busy event loop) takes a fresh turn instead:
# turns that went by unused must not be spent all at once.
LATE_SECONDS = TOLERANCE_SECONDS
# ... at most this many times, each a short wait (then it goes): a request holds its lease while it waits,
# and a frozen test clock never brings a fresh turn.
MAX_RETAKES = 5


async def at_turn(wait: float, sending, retake, gate: asyncio.Semaphore):
    """Send `sending` at its turn, `wait` seconds from now, once `gate` (the endpoint's in-flight cap) lets
    it. Late by more than LATE_SECONDS (a busy event loop, or a full gate), it asks `retake()` (blocking,
    run in a thread) for a fresh turn: (got one, seconds until it, or until it may ask again). So a worker
    never spends a bunch of missed turns at once."""
    due = time.monotonic() + wait
    has_turn, retakes = True, 0
    while True:
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        on_time = has_turn and time.monotonic() - due <= LATE_SECONDS
        if on_time or retakes >= MAX_RETAKES:
            async with gate:
                if on_time and time.monotonic() - due > LATE_SECONDS and retakes < MAX_RETAKES:
                    on_time = False  # the gate was full for too long: this turn went by
                else:
                    return await sending
        has_turn, wait = await asyncio.to_thread(retake)
        retakes += 1
        due = time.monotonic() + wait
