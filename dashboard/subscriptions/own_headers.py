"""A receiver's own headers on its subscription (issue 39): `{"X-Api-Key": "…"}` sent with every attempt,
test event and receiver check, for a gateway that refuses requests without them.

The values are credentials. They are kept encrypted as the signing secret is (one column,
`Subscription.headers_ciphertext`: Fernet of a JSON object), and never shown again: reads, pages, the
audit log and the delivery page's "request as sent" show the names with MASK for each value.

An edit merges (JSON Merge Patch, RFC 7396): a name with a value sets or replaces it, a name with null
removes it, a name left out keeps its value; `"headers": null` removes them all.
"""

from __future__ import annotations

import json

from dashboard.core import crypto
from dashboard.core.validation import ApiError
from dashboard.delivery.http import own_headers, promesa_header_names
from dashboard.models import Subscription

MAX_HEADERS = 10
MAX_BYTES = 4096  # names and values together, as UTF-8 (they are ASCII)
MASK = "••••"  # what reads show for every value; not ASCII, so never a value itself
# Headers HTTP owns, or that Promesa's signatures and own headers claim, beyond those a delivery carries now
# (dashboard.delivery.http.promesa_header_names): refused, case-insensitively.
HTTP_OWNED = ("host", "content-length", "content-type", "transfer-encoding", "connection", "user-agent",
              "x-signature", "content-encoding", "te", "trailer", "upgrade", "keep-alive", "proxy-connection",
              "expect")
REFUSED_PREFIXES = ("webhook-", "x-promesa-")
REFUSED_IN_WORDS = ("Host, Content-Length, Content-Type, Transfer-Encoding, Connection, User-Agent, X-Signature, "
                    "webhook-*, X-Promesa-* and the headers Promesa sets on every delivery (X-Event-Id, "
                    "X-Event-Type, X-Delivery-Id, X-Delivery-Attempt, Accept-Encoding, traceparent)")


def refused(name: str) -> bool:
    lower = name.lower()
    return lower in HTTP_OWNED or lower in promesa_header_names() or lower.startswith(REFUSED_PREFIXES)


def stored(sub: Subscription) -> dict[str, str]:
    """The subscription's own headers, in clear: for sending only."""
    return own_headers(sub.headers_ciphertext)


def names(sub: Subscription) -> list[str]:
    """The names of its own headers, in the order given (pages, the contract)."""
    return list(stored(sub))


def masked(headers: dict[str, str] | list[str]) -> dict[str, str]:
    """The names, each value shown as MASK."""
    return {name: MASK for name in headers}


def masked_of(sub: Subscription) -> dict[str, str]:
    return masked(names(sub))


def checked(headers: dict[str, str]) -> dict[str, str]:
    """422 naming what is wrong that the schema cannot say: a refused name, a name given twice in another case,
    more than MAX_HEADERS, more than MAX_BYTES in all."""
    bad = [name for name in headers if refused(name)]
    if bad:
        raise ApiError(422, f"headers: {', '.join(bad)} may not be set: Promesa sets {'it' if len(bad) == 1 else 'them'} "
                            f"or HTTP owns {'it' if len(bad) == 1 else 'them'} (refused: {REFUSED_IN_WORDS})")
    seen: dict[str, str] = {}
    for name in headers:
        if name.lower() in seen:
            raise ApiError(422, f"headers: {seen[name.lower()]} and {name} are the same header (names ignore case)")
        seen[name.lower()] = name
    if len(headers) > MAX_HEADERS:
        raise ApiError(422, f"headers: at most {MAX_HEADERS} headers (these would be {len(headers)})")
    size = sum(len(name.encode()) + len(value.encode()) for name, value in headers.items())
    if size > MAX_BYTES:
        raise ApiError(422, f"headers: at most {MAX_BYTES} bytes of names and values together (these are {size})")
    return headers


def ciphertext(headers: dict[str, str]) -> str | None:
    """What `Subscription.headers_ciphertext` holds for these headers (None for none)."""
    return crypto.encrypt(json.dumps(headers, separators=(",", ":"))) if headers else None


def merged(sub: Subscription, patch: dict[str, str | None] | None) -> dict[str, str]:
    """The headers after an edit's `patch` (see the module's docstring), checked."""
    if patch is None:
        return {}
    headers = stored(sub)
    by_lower = {name.lower(): name for name in headers}
    for name, value in patch.items():
        old = by_lower.pop(name.lower(), None)
        if old is not None:  # names ignore case: the patch's spelling replaces (or removes) the stored one
            headers.pop(old)
        if value is not None:
            headers[name] = value
            by_lower[name.lower()] = name
    return checked(headers)


def audit_view(before: dict[str, str], after: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Before and after an edit as the audit log keeps them: names, values masked, a replaced value said so."""
    return masked(before), {name: MASK if before.get(name) == value else f"{MASK} (new value)"
                            for name, value in after.items()}
