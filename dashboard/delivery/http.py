"""One HTTP attempt: POST the exact body with its signature, never follow a redirect,
and turn whatever happens into an Outcome."""

from __future__ import annotations

import asyncio
import email.utils
import functools
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from promesa_receiver import signing
from .policies import Outcome
from .targets import _is_ip, is_public

USER_AGENT = "Promesa-Webhooks/1"


@dataclass
class AttemptResult:
    outcome: Outcome
    duration_ms: int
    response_excerpt: str | None


def retry_after_seconds(value: str | None, now_unix: float) -> float | None:
    """Retry-After as seconds: either delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now_unix)


def delivery_headers(*, event_id: str, event_type: str, delivery_id: str, attempt_number: int,
                     scheme: str, secrets: list[str], timestamp: int, body: bytes) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Event-Id": event_id,
        "X-Event-Type": event_type,
        "X-Delivery-Id": delivery_id,
        "X-Delivery-Attempt": str(attempt_number),
    }
    headers.update(signing.sign_headers(scheme, secrets, event_id, timestamp, body))
    return headers


async def post(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], *,
               connect_timeout: float, attempt_timeout: float, excerpt_bytes: int,
               allow_private: bool) -> AttemptResult:
    started = time.monotonic()
    excerpt = None
    try:
        if not allow_private and _private_literal(url):
            return AttemptResult(Outcome(error="private address refused"), 0, None)
        timeout = _timeout(attempt_timeout, connect_timeout)
        async with session.post(url, data=body, headers=headers, allow_redirects=False, timeout=timeout) as resp:
            raw = await resp.content.read(excerpt_bytes)
            excerpt = raw.decode("utf-8", "replace").replace("\x00", "")  # PostgreSQL text cannot hold NUL
            status = resp.status
            if 300 <= status < 400:
                outcome = Outcome(status_code=status, error="redirect not followed")
            else:
                outcome = Outcome(status_code=status, retry_after_seconds=retry_after_seconds(
                    resp.headers.get("Retry-After"), time.time()) if status == 429 else None)
    except asyncio.TimeoutError:
        outcome = Outcome(error="timeout")
    except aiohttp.ClientConnectorError as exc:
        outcome = Outcome(error=f"connection error: {_short(exc)}")
    except aiohttp.ClientError as exc:
        outcome = Outcome(error=f"{type(exc).__name__}: {_short(exc)}")
    except OSError as exc:
        outcome = Outcome(error=f"connection error: {_short(exc)}")
    return AttemptResult(outcome, int((time.monotonic() - started) * 1000), excerpt)


@functools.lru_cache(maxsize=4096)
def _private_literal(url: str) -> bool:
    """Is the URL's host a private IP address written out (which no resolver gets to refuse)?"""
    host = urlsplit(url).hostname or ""
    return _is_ip(host) and not is_public(host)


@functools.lru_cache(maxsize=64)
def _timeout(total: float, connect: float) -> aiohttp.ClientTimeout:
    """One immutable timeout object per setting, not one per request."""
    return aiohttp.ClientTimeout(total=total, sock_connect=connect)


def _short(exc: Exception) -> str:
    return str(exc)[:150] or type(exc).__name__
