"""Webhook signatures, both schemes Promesa speaks. Standard library only.

- "promesa" (Stripe-compatible): ``X-Signature: t=<unix>,v1=<hex>`` where v1 is
  HMAC-SHA256 keyed with the UTF-8 bytes of the whole secret string over
  ``"<t>.<raw body>"``.
- "standard-webhooks": ``webhook-id``, ``webhook-timestamp`` and
  ``webhook-signature: v1,<base64>`` where the key is the base64-decoded part of
  ``whsec_<base64>`` and the signed content is ``"<id>.<timestamp>.<raw body>"``.
"""

from __future__ import annotations

import base64
import hmac
import secrets as _secrets

__all__ = ["PROMESA_HEADER", "CONSUMER_HEADER", "SECRET_PREFIX", "new_secret", "promesa_v1", "promesa_header", "standard_key",
           "standard_signature", "standard_headers", "sign_headers"]

PROMESA_HEADER = "X-Signature"
# On deliveries of a consumer's subscription: that consumer's uid. A header outside the signed content.
CONSUMER_HEADER = "X-Promesa-Consumer"
SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A fresh signing secret; valid for both schemes (24 random bytes, base64)."""
    return SECRET_PREFIX + base64.b64encode(_secrets.token_bytes(24)).decode("ascii")


def promesa_v1(secret: str, timestamp: int, body: bytes) -> str:
    """The hex v1 signature of the promesa scheme."""
    signed = str(int(timestamp)).encode("ascii") + b"." + body
    return hmac.digest(secret.encode("utf-8"), signed, "sha256").hex()  # one-shot HMAC: the C fast path


def promesa_header(secrets: list[str] | str, timestamp: int, body: bytes) -> str:
    """``t=<unix>,v1=<hex>[,v1=<hex>...]``: one v1 per secret (several during rotation)."""
    if isinstance(secrets, str):
        secrets = [secrets]
    parts = [f"t={int(timestamp)}"] + [f"v1={promesa_v1(s, timestamp, body)}" for s in secrets]
    return ",".join(parts)


def standard_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret: the decoded bytes after ``whsec_``."""
    encoded = secret[len(SECRET_PREFIX):] if secret.startswith(SECRET_PREFIX) else secret
    # Strict alphabet (a typo must not silently become another key); padding optional, as in the reference libraries.
    return base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)


def standard_signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64>`` for one secret, as the Standard Webhooks reference libraries compute it."""
    signed = f"{msg_id}.{int(timestamp)}.".encode("utf-8") + body
    digest = hmac.digest(standard_key(secret), signed, "sha256")
    return "v1," + base64.b64encode(digest).decode("ascii")


def standard_headers(secrets: list[str] | str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    if isinstance(secrets, str):
        secrets = [secrets]
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp)),
        "webhook-signature": " ".join(standard_signature(s, msg_id, timestamp, body) for s in secrets),
    }


def sign_headers(scheme: str, secrets: list[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The signature headers a delivery carries under the subscription's scheme."""
    if scheme == "standard-webhooks":
        return standard_headers(secrets, msg_id, timestamp, body)
    return {PROMESA_HEADER: promesa_header(secrets, timestamp, body)}
