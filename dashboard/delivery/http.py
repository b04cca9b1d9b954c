"""One HTTP attempt: POST the exact body with its signature, never follow a redirect,
and turn whatever happens into an Outcome."""

from __future__ import annotations

import email.utils
import functools
import json
import logging
import ssl
import time
import zlib
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from promesa_receiver import signing

from dashboard.core import crypto, tracing
from dashboard.delivery import tls
from dashboard.delivery.failures import (
    CONNECTION_ERROR,
    DNS_ERROR,
    INTERNAL_ERROR,
    INVALID_RESPONSE,
    PRIVATE_ADDRESS_REFUSED,
    REDIRECT_NOT_FOLLOWED,
    TIMEOUT,
    TLS_ERROR,
    error_text,
    short,
)
from dashboard.delivery.policies import Outcome
from dashboard.delivery.targets import PublicOnlyResolver, _is_ip, is_public, public_socket

log = logging.getLogger(__name__)

USER_AGENT = "Promesa-Webhooks/1"
RESPONSE_HEADERS_BYTES = 4096  # attempts.response_headers keeps at most this much of the answer's headers


@dataclass
class AttemptResult:
    outcome: Outcome
    duration_ms: int
    response_excerpt: str | None
    response_headers: str | None = None
    location: str | None = None  # a 3xx's Location, never followed: the receiver check names it


def retry_after_seconds(value: str | None, now_unix: float) -> float | None:
    """Retry-After as seconds: either delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    # ASCII digits only: str.isdigit() is also true for "\u00b2" or "\u2460", which float() refuses.
    if value.isascii() and value.isdigit():
        return float(value)  # a huge number becomes inf; the policy caps the wait
    try:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - now_unix)
    except (TypeError, ValueError, IndexError, OverflowError):  # what the standard library raises on odd dates
        return None


def delivery_headers(*, event_id: str, event_type: str, delivery_id: str, attempt_number: int,
                     scheme: str, secrets: list[str], timestamp: int, body: bytes,
                     consumer: str | None = None, own: Mapping[str, str] | None = None,
                     traceparent: str | None = None) -> dict[str, str]:
    """`own`: the receiver's own headers (an API key its gateway demands), sent first; none of them is one
    Promesa sets (`promesa_header_names`), which the subscription's input refuses. `traceparent`: the W3C trace
    context the producer's trace continues with (dashboard.core.tracing); never the receiver's own."""
    headers = {name: value for name, value in own.items() if name.lower() != tracing.HEADER} if own else {}
    headers |= {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Event-Id": event_id,
        "X-Event-Type": event_type,
        "X-Delivery-Id": delivery_id,
        "X-Delivery-Attempt": str(attempt_number),
        # Only an excerpt of the answer is kept: ask for it plain (a receiver that compresses anyway
        # is decompressed, within the excerpt's size, see _excerpt).
        "Accept-Encoding": "identity",
    }
    if consumer is not None:  # a header, not a field: the signed body stays the same thin event
        headers[signing.CONSUMER_HEADER] = consumer
    if traceparent is not None:
        headers[tracing.HEADER] = traceparent
    headers.update(signing.sign_headers(scheme, secrets, event_id, timestamp, body))
    return headers


@functools.cache
def promesa_header_names() -> frozenset[str]:
    """Every header a delivery carries that Promesa sets, in lower case, read off `delivery_headers` itself
    (both schemes, for a consumer): a receiver's own header may not be one of them."""
    names = set()
    for scheme in ("promesa", "standard-webhooks"):
        names |= delivery_headers(event_id="evt_0", event_type="t", delivery_id="dlv_0", attempt_number=1,
                                  scheme=scheme, secrets=[signing.new_secret()], timestamp=0, body=b"{}",
                                  consumer="c", traceparent="00-" + "1" * 32 + "-" + "1" * 16 + "-01").keys()
    return frozenset(name.lower() for name in names)


def own_headers(ciphertext: str | None) -> dict[str, str]:
    """The receiver's own headers of a subscription (`Subscription.headers_ciphertext`), decrypted; inside
    an app context. Values are credentials: never logged, never shown."""
    return json.loads(crypto.decrypt(ciphertext)) if ciphertext else {}


async def post(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], *,
               connect_timeout: float, attempt_timeout: float, excerpt_bytes: int,
               allow_private: bool, ssl_context: ssl.SSLContext | None = None) -> AttemptResult:
    """Never raises: whatever one receiver answers (or a bug in reading it) is this attempt's outcome.
    `ssl_context`: the subscription's client certificate and trust (dashboard.delivery.tls), None: aiohttp's own."""
    started = time.monotonic()
    excerpt = answer_headers = location = None
    try:
        if not allow_private and _private_literal(url):
            return AttemptResult(Outcome(error=PRIVATE_ADDRESS_REFUSED), 0, None)
        timeout = _timeout(attempt_timeout, connect_timeout)
        async with session.post(url, data=body, headers=headers, allow_redirects=False, timeout=timeout,
                                ssl=True if ssl_context is None else ssl_context) as resp:
            status = resp.status
            answer_headers = headers_text(resp.raw_headers)
            excerpt = await _excerpt(resp, excerpt_bytes)
            if 300 <= status < 400:
                outcome = Outcome(status_code=status, error=REDIRECT_NOT_FOLLOWED)
                location = resp.headers.get("Location")
            else:
                outcome = Outcome(status_code=status, retry_after_seconds=retry_after_seconds(
                    resp.headers.get("Retry-After"), time.time()) if status == 429 else None)
    except TimeoutError:
        outcome = Outcome(error=TIMEOUT)
    except aiohttp.ClientConnectorCertificateError as exc:  # the reason first: the stored error is short
        outcome = Outcome(error=error_text(TLS_ERROR, _certificate_problem(exc)))
    except aiohttp.ClientConnectorDNSError as exc:
        outcome = Outcome(error=error_text(DNS_ERROR, f"{exc.os_error.strerror or exc} ({exc.host})"))
    except aiohttp.ClientConnectorSSLError as exc:
        outcome = Outcome(error=error_text(TLS_ERROR, exc.os_error))
    except aiohttp.ClientConnectorError as exc:
        outcome = Outcome(error=error_text(CONNECTION_ERROR, exc))
    except aiohttp.ClientResponseError as exc:
        # aiohttp's own "400" for an answer it could not parse (status line, headers): the receiver
        # sent no status code we could read, so none is recorded.
        outcome = Outcome(error=error_text(INVALID_RESPONSE, exc.message or exc))
    except aiohttp.ClientError as exc:
        refused = tls.handshake_refusal(exc, url[:6].lower() == "https:")  # a TLS alert comes after the handshake
        outcome = Outcome(error=error_text(TLS_ERROR, refused) if refused else error_text(type(exc).__name__, exc))
    except OSError as exc:
        outcome = Outcome(error=error_text(CONNECTION_ERROR, exc))
    except Exception as exc:
        log.exception("attempt to %s failed inside Promesa", url)
        outcome = Outcome(error=error_text(INTERNAL_ERROR, exc))
    return AttemptResult(outcome, int((time.monotonic() - started) * 1000), excerpt, answer_headers, location)


def traced(span, sending: Awaitable[AttemptResult]) -> Awaitable[AttemptResult]:
    """`sending`, ending the attempt's span (dashboard.core.tracing.attempt) with its outcome; as is without one."""
    return sending if span is None else _traced(span, sending)


async def _traced(span, sending: Awaitable[AttemptResult]) -> AttemptResult:
    try:
        result = await sending
    except BaseException as exc:  # cancelled (a drain that gave up on it): the span still ends
        tracing.end_attempt(span, None, type(exc).__name__)
        raise
    tracing.end_attempt(span, result.outcome.status_code, result.outcome.error)
    return result


def headers_text(raw: tuple[tuple[bytes, bytes], ...], limit: int = RESPONSE_HEADERS_BYTES) -> str:
    """The answer's headers as "Name: value" lines, as received, cut to `limit` bytes of UTF-8 (whole
    lines; a cut says so). Bytes that are not UTF-8 are replaced, NUL removed (PostgreSQL text)."""
    lines, size, more = [], 0, "[more headers not kept]"
    budget = limit - len(more) - 1  # room for the notice too: the whole text stays within `limit`
    for name, value in raw:
        line = f"{name.decode('latin-1')}: {value.decode('utf-8', 'replace')}".replace("\x00", "")
        size += len(line.encode("utf-8")) + 1
        if size > budget:
            lines.append(more)
            break
        lines.append(line)
    return "\n".join(lines)


def client_session(limit: int, allow_private: bool) -> aiohttp.ClientSession:
    """The session deliveries (and receiver checks) are sent with; create it inside a running event loop."""
    # Pooled keep-alive connections; DNS cannot steer a request inward unless private targets are allowed.
    # A tenant's connections, to one host or all, are bounded by its slots (docs/scheduler.md); the pool is their hard bound.
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit,
                                     resolver=None if allow_private else PublicOnlyResolver(),
                                     socket_factory=None if allow_private else public_socket)
    # No cookie jar: endpoints of different teams share hosts, and a cookie one of them sets
    # must never be sent to another (nor back to itself: a delivery is not a browsing session).
    return aiohttp.ClientSession(connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar())


async def failed(exc: Exception) -> AttemptResult:
    """The result of an attempt that could not even be prepared (signing, decrypting the secret)."""
    return AttemptResult(Outcome(error=error_text(INTERNAL_ERROR, exc)), 0, None)


async def _excerpt(resp: aiohttp.ClientResponse, limit: int) -> str:
    """At most `limit` bytes of the answer, as text; the rest is never read (closing the
    connection drops it), so a 50 MB answer costs what its first kilobyte does."""
    try:
        raw = await resp.content.read(limit)
    except aiohttp.ClientPayloadError as exc:
        # Cut off or malformed mid-body (chunking): the status line has already answered.
        return f"[body unreadable: {short(exc)}]"
    encoding = resp.headers.get("Content-Encoding", "").strip().lower()
    if encoding in ("gzip", "x-gzip", "deflate") and raw:
        raw = _inflate(raw, limit)
        if raw is None:
            return f"[{encoding} body that could not be decompressed]"
    return raw.decode("utf-8", "replace").replace("\x00", "")  # PostgreSQL text cannot hold NUL


def _inflate(raw: bytes, limit: int) -> bytes | None:
    """The start of a gzip or zlib stream, decompressed to at most `limit` bytes (a bomb stays small)."""
    for wbits in (zlib.MAX_WBITS | 32, -zlib.MAX_WBITS):  # gzip or zlib header, else raw deflate
        try:
            return zlib.decompressobj(wbits).decompress(raw, limit)
        except zlib.error:
            continue
    return None


def _certificate_problem(exc: aiohttp.ClientConnectorCertificateError) -> str:
    """What is wrong with the receiver's certificate (self-signed, expired, another name), and where."""
    problem = getattr(exc.certificate_error, "verify_message", None) or exc.certificate_error
    return f"certificate verify failed: {problem} ({exc.host}:{exc.port})"


@functools.lru_cache(maxsize=4096)
def _private_literal(url: str) -> bool:
    """Is the URL's host a private IP address written out (which no resolver gets to refuse)?"""
    host = urlsplit(url).hostname or ""
    return _is_ip(host) and not is_public(host)


@functools.lru_cache(maxsize=64)
def _timeout(total: float, connect: float) -> aiohttp.ClientTimeout:
    """One immutable timeout object per setting, not one per request."""
    return aiohttp.ClientTimeout(total=total, sock_connect=connect)


def short(exc) -> str:
    return str(exc)[:150] or type(exc).__name__
