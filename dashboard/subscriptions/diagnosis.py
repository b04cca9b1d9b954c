"""Why a subscription's deliveries fail: its recent failed attempts grouped by cause, each with plain
advice (the seed document's "no recibo notificaciones" checklist, made concrete). It reads the
attempts Promesa already stores and sends nothing.

The causes, in the order a receiver's owner usually fixes them: no OAuth2 token, DNS name not found, connection
refused, TLS (certificate name, expiry, self-signed), timeout, 3xx, 401/403, 404, 410, 413, 429,
5xx, then any other 4xx and any other error.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field

from sqlalchemy import select

from dashboard.core.clock import iso
from dashboard.core.extensions import db
from dashboard.delivery.failures import cause
from dashboard.models import Attempt, ConsumerState, Delivery, Subscription
from dashboard.subscriptions import own_headers

WINDOW = dt.timedelta(hours=24)
MAX_ATTEMPTS = 2000  # the newest this many attempts of the window: enough to see a pattern, cheap to read

ADVICE = {
    "auth_failed": "Promesa could not get an OAuth2 access token from this subscription's token URL, so nothing "
                   "was sent to the endpoint: the error says what the token endpoint did. Check the token URL, the "
                   "client id and secret, the scope and the audience with the receiver's authorization server (edit "
                   "the subscription and type the secret again if it changed); the token endpoint must answer 2xx "
                   "with JSON carrying access_token. Attempts keep their retry schedule meanwhile.",
    "dns": "The endpoint's host name does not resolve: check the URL's spelling and that its DNS record "
           "exists and is public (Promesa sends from the internet, and never to private addresses).",
    "refused": "Nothing accepts connections at that host and port: is the server running, listening on "
               "that port, and reachable through its firewall from the internet?",
    "tls_name": "The TLS certificate does not name the URL's host: serve a certificate for exactly that "
                "host name, or register the URL with the name the certificate carries.",
    "tls_expired": "The TLS certificate has expired: renew it (and automate the renewal).",
    "tls_self_signed": "The TLS certificate is self-signed or signed by an unknown authority: use one from "
                       "a public authority, and serve the whole chain (intermediates included).",
    "tls_client_certificate": "The receiver ended the TLS connection before answering, as one that requires a "
                              "client certificate does when none is set or it does not accept the one set "
                              "(another authority, expired, not a subject it admits). Set or renew the "
                              "subscription's client certificate, and ask the receiver which it accepts.",
    "tls": "The TLS handshake failed: check the certificate (its name, its expiry, the whole chain) "
           "with an SSL checker.",
    "timeout": "Your endpoint answers too slowly: answer 2xx fast, work later. Store the event, enqueue a "
               "job, answer; Promesa waits {limit:g} s at most and counts a slower answer as a failure.",
    "redirect": "Your endpoint redirects, and Promesa never follows redirects: register the final URL "
                "(where the redirect leads) instead.",
    "unauthorized": "Your endpoint refuses the requests (401/403): most likely its signature check. Are you "
                    "using the current secret (after a rotation, accept both), and verifying the raw body "
                    "bytes exactly as received, before parsing JSON?",
    "not_found": "Your endpoint answers 404: the path is wrong. Register the URL your route listens on.",
    "gone": "Your endpoint answered 410 Gone, so Promesa disabled the subscription (its deliveries are "
            "held, not dropped). Fix the endpoint, then enable the subscription.",
    "too_large": "Your endpoint refuses the body as too large (413): raise its body limit (accept at least "
                 "256 KiB).",
    "rate_limited": "Your endpoint is rate limiting Promesa (429): set a rate limit on this subscription "
                    "below the receiver's, so deliveries wait their turn here instead of failing there.",
    "server_error": "Your endpoint fails (5xx): look at its logs for these times. Store the event and answer "
                    "2xx before anything that can fail; do the work later in a job.",
    "client_error": "Your endpoint refuses the requests with a 4xx: its logs say why. Answer 2xx to every "
                    "correctly signed event, and 400/401/403 only when the signature does not verify.",
    "lease_expired": "Your pulling client took deliveries and did not acknowledge them before their lease ran "
                     "out: acknowledge each one (POST .../pull/ack) within the lease, ask for a longer lease, or "
                     "pull fewer at a time. A client that died mid-batch looks the same.",
    "pull_reported": "Your pulling client acknowledged these deliveries as failed without a status: the error is "
                     "what it sent. Look at its logs for these times.",
    "other": "The request failed before an answer came: the error says why.",
}

LABELS = {
    "auth_failed": "OAuth2 token not obtained",
    "dns": "DNS name not found", "refused": "Connection refused", "tls_name": "TLS: certificate name",
    "tls_expired": "TLS: certificate expired", "tls_self_signed": "TLS: self-signed certificate",
    "tls_client_certificate": "TLS: client certificate refused", "tls": "TLS error", "timeout": "Timeout", "redirect": "3xx redirect", "unauthorized": "401 or 403",
    "not_found": "404 Not Found", "gone": "410 Gone", "too_large": "413 Payload Too Large",
    "rate_limited": "429 Too Many Requests", "server_error": "5xx", "client_error": "Other 4xx",
    "lease_expired": "Lease ran out (pull)", "pull_reported": "Failure reported by the puller",
    "other": "Other error",
}
ORDER = tuple(LABELS)


@dataclass
class Group:
    cause: str
    count: int = 0
    last_at: dt.datetime | None = None
    example: str = ""  # the newest attempt's status or error, as stored
    status_codes: set = field(default_factory=set)

    @property
    def label(self) -> str:
        return LABELS[self.cause]


@dataclass
class Diagnosis:
    since: dt.datetime
    attempts: int
    failures: int
    p95_ms: int | None  # answer time of the window's answered attempts (timeouts included, at their duration)
    groups: list[Group]
    limit_seconds: float  # the subscription's whole-attempt timeout (10 s unless lowered)
    consumer: str | None = None  # the uid of the consumer whose endpoint it is (None: the team's own)
    consumer_disabled: bool = False  # its deliveries are held by the consumer, whatever the endpoint does
    own_headers: tuple[str, ...] = ()  # the names of the receiver's own headers: a 401 may be about them
    bearer: bool = False  # it sends an OAuth2 bearer token: a 401 may be about that

    def advice(self, group: Group) -> str:
        text = ADVICE[group.cause].format(limit=self.limit_seconds)
        if group.cause == "timeout" and self.p95_ms is not None:
            text = (f"95 % of attempts took up to {readable_ms(self.p95_ms)}, against the "
                    f"{self.limit_seconds:g} s limit. " + text)
        if group.cause == "unauthorized" and self.own_headers:
            text += (f" Or its gateway refuses the headers this subscription sends ({', '.join(self.own_headers)}): "
                     "edit the subscription and give the values the receiver expects now (they are never shown, "
                     "so type them again).")
        if group.cause == "unauthorized" and self.bearer:
            text += (" Or it refuses the OAuth2 bearer token Promesa gets from the subscription's token URL (Promesa "
                     "already asks for a fresh one once on a 401): check that the receiver trusts that authorization "
                     "server, and the scope and audience the token is asked for.")
        return text


def readable_ms(ms: int) -> str:
    """A duration as people read it: "40 ms" under a second, "1.2 s" from one on."""
    return f"{ms} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def p95(durations: list[int]) -> int | None:
    if not durations:
        return None
    ordered = sorted(durations)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def diagnose(sub: Subscription, now: dt.datetime) -> Diagnosis:
    since = now - WINDOW
    rows = db.session.execute(
        select(Attempt.status_code, Attempt.error, Attempt.duration_ms, Attempt.attempted_at)
        .join(Delivery, Delivery.id == Attempt.delivery_id)
        .where(Delivery.subscription_id == sub.id, Attempt.attempted_at >= since, Attempt.attempted_at <= now)
        .order_by(Attempt.attempted_at.desc(), Attempt.id.desc()).limit(MAX_ATTEMPTS)).all()
    groups: dict[str, Group] = {}
    timed: list[int] = []  # answers and timeouts: a refused connection or a failed lookup measures nothing
    for row in rows:  # newest first: the first of each cause is its example
        found = cause(row.status_code, row.error)
        if row.status_code is not None or found == "timeout":
            timed.append(row.duration_ms)
        if found is None:
            continue
        group = groups.setdefault(found, Group(found))
        if not group.count:
            group.last_at = row.attempted_at
            group.example = " ".join(str(p) for p in (row.status_code, row.error) if p is not None)
        group.count += 1
        if row.status_code is not None:
            group.status_codes.add(row.status_code)
    ordered = sorted(groups.values(), key=lambda g: (-g.count, ORDER.index(g.cause)))
    return Diagnosis(since=since, attempts=len(rows), failures=sum(g.count for g in ordered),
                     p95_ms=p95(timed), groups=ordered, limit_seconds=sub.attempt_timeout,
                     consumer=sub.consumer.uid if sub.consumer_id is not None else None,
                     consumer_disabled=sub.consumer_id is not None and sub.consumer.state == ConsumerState.DISABLED,
                     own_headers=tuple(own_headers.names(sub)) if "unauthorized" in groups else (),
                     bearer=sub.auth_ciphertext is not None)


def as_json(sub: Subscription, d: Diagnosis) -> dict:
    return {"subscription_id": sub.id, "consumer": d.consumer, "consumer_disabled": d.consumer_disabled,
            "since": iso(d.since), "attempts": d.attempts, "failures": d.failures,
            "p95_ms": d.p95_ms, "timeout_limit_seconds": d.limit_seconds,
            "groups": [{"cause": g.cause, "label": g.label, "count": g.count, "last_at": iso(g.last_at),
                        "example": g.example, "status_codes": sorted(g.status_codes), "advice": d.advice(g)}
                       for g in d.groups]}
