"""Failed sign-ins counted per account and per client address, in Redis, so every web process
(gunicorn workers, several machines) shares one count. Built on `limits`, the engine of Flask-Limiter:
only *failed* attempts count, which Flask-Limiter's per-route decorators express less directly."""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass

import redis
from flask import Flask, current_app
from limits import parse
from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter

from dashboard.queue.work import connect

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refusal:
    """Why a sign-in is refused before the password is even checked, and for how long."""

    reason: str
    retry_after_seconds: int


class LoginThrottle:
    def __init__(self, app: Flask):
        conn = connect(app)
        storage = RedisStorage("redis://", connection_pool=conn.connection_pool,
                               key_prefix=f"{app.config['PROMESA_REDIS_PREFIX']}:login-throttle")
        self._limiter = MovingWindowRateLimiter(storage)
        self._per_account = parse(app.config["PROMESA_LOGIN_LIMIT_PER_ACCOUNT"])
        self._per_address = parse(app.config["PROMESA_LOGIN_LIMIT_PER_ADDRESS"])

    @classmethod
    def for_app(cls, app: Flask | None = None) -> LoginThrottle:
        app = app or current_app
        throttle = app.extensions.get("promesa_login_throttle")
        if throttle is None:
            throttle = app.extensions["promesa_login_throttle"] = cls(app)
        return throttle

    def _checks(self, email: str, address: str | None):
        # The email is hashed: Redis keys never hold an address book, and odd bytes stay out of key names.
        account = hashlib.sha256(email.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        return [("this account", self._per_account, ("account", account)),
                ("this address", self._per_address, ("address", address or "unknown"))]

    def refusal(self, email: str, address: str | None) -> Refusal | None:
        """A Refusal if this account or this address has used up its failed attempts."""
        try:
            for who, limit, identifiers in self._checks(email, address):
                if not self._limiter.test(limit, *identifiers):
                    reset_at = self._limiter.get_window_stats(limit, *identifiers).reset_time
                    return Refusal(who, max(1, math.ceil(reset_at - time.time())))
        except redis.RedisError:
            # Operators must still sign in during a Redis outage; password hashing still slows guessing.
            log.warning("login throttle unavailable (Redis unreachable): sign-in allowed unthrottled")
        return None

    def succeeded(self, email: str) -> None:
        """The account's owner got in: their earlier typos no longer count against the account."""
        _, limit, identifiers = self._checks(email, None)[0]
        try:
            self._limiter.clear(limit, *identifiers)
        except redis.RedisError:
            log.warning("login throttle unavailable (Redis unreachable): the account's count was not reset")

    def failed(self, email: str, address: str | None) -> None:
        try:
            for _, limit, identifiers in self._checks(email, address):
                self._limiter.hit(limit, *identifiers)
        except redis.RedisError:
            log.warning("login throttle unavailable (Redis unreachable): a failed sign-in was not counted")
