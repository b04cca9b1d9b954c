"""What kind of failure an attempt was: one reading of its status code and error text, for everything
that tells failures apart (the diagnosis's causes, a subscription's last failure in words).

An attempt's error is stored as text, "<kind>: <detail>", cut to ERROR_LENGTH; the kinds are written here
(`error_text`) by the HTTP attempt, the OAuth2 token fetch and pull delivery, and read back by `cause`.
Whether a failure is retried is the retry policy's (delivery.policies), not a kind's.
"""

from __future__ import annotations

ERROR_LENGTH = 200  # attempts.error and deliveries.last_error hold this many characters

# The kinds of error an attempt records (no answer, or one that is not judged by its status).
TIMEOUT = "timeout"
DNS_ERROR = "DNS error"
TLS_ERROR = "TLS error"
CONNECTION_ERROR = "connection error"
INVALID_RESPONSE = "invalid response"
INTERNAL_ERROR = "internal error"
REDIRECT_NOT_FOLLOWED = "redirect not followed"
PRIVATE_ADDRESS_REFUSED = "private address refused"
AUTH_FAILED = "auth failed"  # no OAuth2 token: nothing was sent to the endpoint (delivery.oauth)
LEASE_EXPIRED = "lease expired"  # a pull lease that ran out unacked (delivery.pull)
REPORTED = "receiver"  # a pull client's ack of a failure without a status (delivery.pull)

_DNS = ("dns error", "name or service not known", "nodename nor servname", "no address associated", "name resolution",
        "getaddrinfo", "resolves only to private addresses", "dns")
_REFUSED = ("connect call failed", "connection refused", "errno 111", "private address refused")
# Not "ssl" alone: every connection error says "ssl:default" or "ssl:True".
_TLS = ("tls error", "certificate", "[ssl:", "sslerror", "sslcert", "ssl error", "handshake", "wrong version number")
_NAMED_STATUS = {404: "not_found", 410: "gone", 413: "too_large", 429: "rate_limited"}
# A status code's cause, in the few words a subscription's last failure is shown with.
_STATUS_WORDS = {"redirect": "redirect", "gone": "gone", "rate_limited": "rate limited", "server_error": "server error",
                 "client_error": "client error", "unauthorized": "client error", "not_found": "client error",
                 "too_large": "client error"}
# Error kinds that need more words than their own.
_KIND_WORDS = {AUTH_FAILED: "auth failed (no OAuth2 token)"}


def error_text(kind: str, detail) -> str:
    """An attempt's stored error: its kind, then what happened, within ERROR_LENGTH."""
    return f"{kind}: {short(detail)}"[:ERROR_LENGTH]


def short(detail) -> str:
    return str(detail)[:150] or type(detail).__name__


def cause(status_code: int | None, error: str | None) -> str | None:
    """The cause of one attempt's failure (a key of subscriptions.diagnosis.ADVICE), or None when it succeeded."""
    if status_code is not None:
        if 200 <= status_code < 300:
            return None
        if 300 <= status_code < 400:
            return "redirect"
        if status_code in (401, 403):
            return "unauthorized"
        if status_code in _NAMED_STATUS:
            return _NAMED_STATUS[status_code]
        return "server_error" if status_code >= 500 else "client_error"
    text = (error or "").lower()
    if text.startswith(AUTH_FAILED):  # the token endpoint's failure, whatever it was (a timeout, a refusal)
        return "auth_failed"
    if text.startswith(LEASE_EXPIRED):  # a pull subscription's: its client never acknowledged
        return "lease_expired"
    if text.startswith(REPORTED + ":"):  # a pull subscription's client acknowledged a failure without a status
        return "pull_reported"
    if text.startswith(TIMEOUT) or "timed out" in text:
        return "timeout"
    if any(word in text for word in _TLS):
        if "client certificate" in text:  # dashboard.delivery.tls.handshake_refusal: the receiver's alert
            return "tls_client_certificate"
        if "mismatch" in text or "doesn't match" in text or "not valid for" in text:
            return "tls_name"
        if "expired" in text:
            return "tls_expired"
        if "self-signed" in text or "self signed" in text or "unable to get local issuer" in text:
            return "tls_self_signed"
        return "tls"
    if any(word in text for word in _DNS):
        return "dns"
    if any(word in text for word in _REFUSED):
        return "refused"
    return "other"


def words(status_code: int | None, error: str | None) -> str:
    """What kind of failure an attempt was, in a few words: "HTTP 503 (server error)", "timeout",
    "connection error"; the detail follows on the page."""
    if status_code is not None:
        kind = _STATUS_WORDS.get(cause(status_code, None)) if 300 <= status_code < 600 else None
        return f"HTTP {status_code}" + (f" ({kind})" if kind else "")
    if not error:
        return "unknown error"
    kind = error.split(":", 1)[0]
    return _KIND_WORDS.get(kind, kind)
