"""Failed sign-ins counted per account and per client address, in Redis, so every web process
(gunicorn workers, several machines) shares one count. Each attempt is counted as failed *before* the
password is checked, in the same atomic step that checks the limit: concurrent guesses cannot all pass
a check made before any of them was counted. A sign-in that succeeds takes its attempt back."""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
from dataclasses import dataclass

import redis
from flask import Flask, current_app
from limits import parse

from dashboard.queue.work import connect

log = logging.getLogger(__name__)

# KEYS: one sorted set per limit (attempts scored by their time). ARGV: the attempt's id, then each key's
# limit and window in seconds. Answers {0} (counted in every set) or {1 + index of the full set, seconds
# until its oldest attempt leaves the window}. Redis's clock: web machines never disagree about the window.
_ATTEMPT = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1e6
for i, key in ipairs(KEYS) do
  local limit, window = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  if redis.call('ZCARD', key) >= limit then
    local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    return {i, string.format('%.3f', tonumber(oldest[2] or now) + window - now)}
  end
end
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, now, ARGV[1])
  redis.call('EXPIRE', key, math.ceil(tonumber(ARGV[2 * i + 1])))
end
return {0}
"""


@dataclass(frozen=True)
class Refusal:
    """Why a sign-in is refused before the password is even checked, and for how long."""

    reason: str
    retry_after_seconds: int


@dataclass(frozen=True)
class Attempt:
    """One sign-in attempt: refused, or counted as failed until `LoginThrottle.succeeded` takes it back."""

    refusal: Refusal | None
    id: str = ""
    keys: tuple[str, ...] = ()  # (the account's set, the address's set); empty when Redis was away


class LoginThrottle:
    def __init__(self, app: Flask):
        self._conn = connect(app)
        self._script = self._conn.register_script(_ATTEMPT)
        self._prefix = f"{app.config['PROMESA_REDIS_PREFIX']}:login-throttle"
        self._per_account = parse(app.config["PROMESA_LOGIN_LIMIT_PER_ACCOUNT"])
        self._per_address = parse(app.config["PROMESA_LOGIN_LIMIT_PER_ADDRESS"])

    @classmethod
    def for_app(cls, app: Flask | None = None) -> LoginThrottle:
        app = app or current_app
        throttle = app.extensions.get("promesa_login_throttle")
        if throttle is None:
            throttle = app.extensions["promesa_login_throttle"] = cls(app)
        return throttle

    def _account_key(self, email: str) -> str:
        # The email is hashed: Redis keys never hold an address book, and odd bytes stay out of key names.
        return f"{self._prefix}:account:{hashlib.sha256(email.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}"

    def attempt(self, email: str, address: str | None) -> Attempt:
        """Count this attempt as failed against the account and the address, in one atomic step, or refuse it
        if either has used up its failed attempts (then it counts nowhere)."""
        keys = (self._account_key(email), f"{self._prefix}:address:{address or 'unknown'}")
        limits = (self._per_account, self._per_address)
        attempt_id = secrets.token_hex(8)
        try:
            answer = self._script(keys=list(keys), args=[attempt_id, *(
                value for limit in limits for value in (limit.amount, limit.get_expiry()))])
        except redis.RedisError:
            # Operators must still sign in during a Redis outage; password hashing still slows guessing.
            log.warning("login throttle unavailable (Redis unreachable): sign-in allowed unthrottled")
            return Attempt(None)
        if answer[0]:
            who = ("this account", "this address")[int(answer[0]) - 1]
            return Attempt(Refusal(who, max(1, math.ceil(float(answer[1])))))
        return Attempt(None, attempt_id, keys)

    def succeeded(self, attempt: Attempt) -> None:
        """The account's owner got in: this attempt and their earlier typos no longer count against the
        account, and this attempt no longer counts against the address."""
        if not attempt.keys:
            return
        account, address = attempt.keys
        try:
            self._conn.pipeline(transaction=True).delete(account).zrem(address, attempt.id).execute()
        except redis.RedisError:
            log.warning("login throttle unavailable (Redis unreachable): the account's count was not reset")
