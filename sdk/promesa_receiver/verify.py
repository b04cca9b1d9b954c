"""Signature verification for both schemes Promesa signs with (see ``promesa_receiver.signing``).

Standard library only. Always verify the *raw* request body bytes, exactly as received:
parsing the JSON and serialising it again changes the bytes and breaks the signature.

Checks run in this order, each with its own exception (all ``VerificationError``):

1. the header is present and not empty          -> ``MissingSignature``
2. the header parses (integer ``t``, a ``v1``)  -> ``MalformedSignature``
3. ``|now - t| <= tolerance`` (past *and* future) -> ``TimestampOutsideTolerance``
4. some ``v1`` matches some secret (constant-time ``hmac.compare_digest``) -> ``SignatureMismatch``

During a secret rotation the sender puts one ``v1`` per active secret in the header and the
receiver may hold several secrets; any (v1, secret) pair that matches is accepted.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
import time
from collections.abc import Iterable, Mapping

from .signing import CONSUMER_HEADER, promesa_v1, standard_key, standard_signature
from .errors import MalformedSignature, MissingSignature, SignatureMismatch, TimestampOutsideTolerance

DEFAULT_TOLERANCE = 300

# A canonical unix timestamp: digits, no sign, no leading zero (the signer writes str(int(t))).
_UNIX_RE = re.compile(r"0|[1-9][0-9]{0,14}")
_HEX64_RE = re.compile(r"[0-9a-fA-F]{64}")
_SHA256_BYTES = 32


# -- shared checks ----------------------------------------------------------------------
def _body_bytes(raw_body) -> bytes:
    if isinstance(raw_body, str):
        raise TypeError("pass the raw request body as bytes, exactly as received; a decoded or "
                        "re-serialised body does not match the signature")
    if not isinstance(raw_body, (bytes, bytearray, memoryview)):
        raise TypeError(f"raw_body must be bytes, not {type(raw_body).__name__}")
    return bytes(raw_body)


def _secret_list(secrets: Iterable[str] | str) -> list[str]:
    """The configured secrets; a configuration mistake is a ValueError/TypeError raised on
    every call, never a VerificationError (which would look like a bad request)."""
    if isinstance(secrets, str):
        secrets = [secrets]
    secrets = list(secrets)
    if not secrets:
        raise ValueError("no secrets configured: pass at least one signing secret")
    for i, secret in enumerate(secrets):
        if not isinstance(secret, str):
            raise TypeError(f"secret #{i} must be a str, not {type(secret).__name__}")
        if not secret:
            raise ValueError(f"secret #{i} is empty")
    return secrets


def _check_tolerance(tolerance) -> None:
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or tolerance < 0:
        raise ValueError(f"tolerance must be a number of seconds >= 0, not {tolerance!r}")


def _parse_unix(value: str, where: str) -> int:
    if not _UNIX_RE.fullmatch(value):
        raise MalformedSignature(f"{where} is not an integer unix timestamp")
    return int(value)


def _check_window(timestamp: int, tolerance: float, now: float | None) -> None:
    now = time.time() if now is None else now
    skew = now - timestamp
    if skew > tolerance:
        raise TimestampOutsideTolerance(
            f"timestamp {timestamp} is {skew:.0f}s in the past; the tolerance is {tolerance}s "
            "(a replay, or a delivery delayed past the window)")
    if -skew > tolerance:
        raise TimestampOutsideTolerance(
            f"timestamp {timestamp} is {-skew:.0f}s in the future; the tolerance is {tolerance}s "
            "(check the clocks)")


# -- promesa: X-Signature: t=<unix>,v1=<hex>[,v1=<hex>...] --------------------------------
def parse_promesa_header(signature_header: str | None) -> tuple[int, list[str]]:
    """``(timestamp, [v1 hex, ...])`` of a promesa signature header.

    Items are comma-separated ``key=value`` pairs; exactly one ``t``, at least one ``v1``
    (64 hex digits). Items of other schemes (``v0=``, a future ``v2=``) are ignored."""
    if signature_header is None:
        raise MissingSignature("no signature header")
    if isinstance(signature_header, (bytes, bytearray)):
        try:
            signature_header = bytes(signature_header).decode("ascii")
        except UnicodeDecodeError:
            raise MalformedSignature("signature header is not ASCII") from None
    if not isinstance(signature_header, str):
        raise MalformedSignature(f"signature header must be a str, not {type(signature_header).__name__}")
    header = signature_header.strip()
    if not header:
        raise MissingSignature("signature header is empty")
    t_values: list[str] = []
    v1_values: list[str] = []
    for n, item in enumerate(header.split(","), start=1):
        key, sep, value = item.strip().partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise MalformedSignature(f"signature header item #{n} is not key=value")
        if key == "t":
            t_values.append(value)
        elif key == "v1":
            if not _HEX64_RE.fullmatch(value):
                raise MalformedSignature(f"signature header item #{n}: v1 is not 64 hex digits")
            v1_values.append(value.lower())
    if len(t_values) != 1:
        raise MalformedSignature(f"signature header needs exactly one t=, found {len(t_values)}")
    timestamp = _parse_unix(t_values[0], "t")
    if not v1_values:
        raise MalformedSignature("signature header has no v1 signature")
    return timestamp, v1_values


def verify(raw_body: bytes, signature_header: str | None, secrets: list[str] | str,
           tolerance: int = DEFAULT_TOLERANCE, now: float | None = None) -> int:
    """Verify a promesa-signed delivery (header ``X-Signature``) and return its timestamp.

    ``secrets``: every currently valid secret (several during a rotation).
    ``tolerance``: seconds the timestamp may differ from ``now`` in either direction.
    ``now``: unix seconds, for tests; defaults to ``time.time()``.

    Raises ``MissingSignature``, ``MalformedSignature``, ``TimestampOutsideTolerance`` or
    ``SignatureMismatch`` (all ``VerificationError``, a ``ValueError``)."""
    body = _body_bytes(raw_body)
    secrets = _secret_list(secrets)
    _check_tolerance(tolerance)
    timestamp, candidates = parse_promesa_header(signature_header)
    _check_window(timestamp, tolerance, now)
    for secret in secrets:
        expected = promesa_v1(secret, timestamp, body).encode("ascii")
        for candidate in candidates:
            if hmac.compare_digest(expected, candidate.encode("ascii")):
                return timestamp
    raise SignatureMismatch(
        f"none of the {len(candidates)} v1 signature(s) matches any of the {len(secrets)} secret(s) "
        "(wrong secret, tampered body, or the body was not verified as the raw bytes received)")


# -- Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature ------------------
def _lower_headers(headers: Mapping[str, str]) -> dict[str, str]:
    items = headers.items() if hasattr(headers, "items") else headers
    lowered: dict[str, str] = {}
    for name, value in items:
        if isinstance(name, (bytes, bytearray)):
            name = bytes(name).decode("latin-1")
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode("latin-1")
        key = str(name).lower()
        if key in lowered and lowered[key] != value:
            raise MalformedSignature(f"header {key} is given twice with different values")
        lowered[key] = value
    return lowered


def _standard_keys_ok(secrets: list[str]) -> None:
    for i, secret in enumerate(secrets):
        try:
            key = standard_key(secret)
        except (binascii.Error, ValueError):
            raise ValueError(f"secret #{i} is not a valid whsec_<base64> secret") from None
        if not key:
            raise ValueError(f"secret #{i} decodes to an empty key")


def parse_standard_signatures(value: str) -> list[bytes]:
    """The decoded ``v1`` signatures of a ``webhook-signature`` header: a space-separated list
    of ``<version>,<base64>``; versions other than ``v1`` (e.g. ``v1a``) are ignored."""
    found: list[bytes] = []
    for n, entry in enumerate(value.split(), start=1):
        version, sep, encoded = entry.partition(",")
        if not sep or not version or not encoded:
            raise MalformedSignature(f"webhook-signature entry #{n} is not <version>,<base64>")
        if version != "v1":
            continue
        try:
            decoded = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise MalformedSignature(f"webhook-signature entry #{n}: v1 is not valid base64") from None
        if len(decoded) != _SHA256_BYTES:
            raise MalformedSignature(f"webhook-signature entry #{n}: v1 is {len(decoded)} bytes, not 32")
        found.append(decoded)
    if not found:
        raise MalformedSignature("webhook-signature has no v1 signature")
    return found


def verify_standard(raw_body: bytes, headers: Mapping[str, str], secrets: list[str] | str,
                    tolerance: int = DEFAULT_TOLERANCE, now: float | None = None) -> int:
    """Verify a Standard Webhooks delivery and return its signed timestamp (``webhook-timestamp``,
    unix seconds), as ``verify`` does; the message id is the ``webhook-id`` header, signed too.

    Header names are matched case-insensitively. Each secret is ``whsec_<base64>``; the HMAC
    key is the decoded bytes and the signed content is ``<id>.<timestamp>.<raw body>``.
    Same exceptions and the same order of checks as ``verify``."""
    body = _body_bytes(raw_body)
    secrets = _secret_list(secrets)
    _standard_keys_ok(secrets)
    _check_tolerance(tolerance)
    lowered = _lower_headers(headers)
    names = ("webhook-id", "webhook-timestamp", "webhook-signature")
    values = {name: lowered.get(name) for name in names}
    missing = [name for name in names if values[name] is None or not str(values[name]).strip()]
    if missing:
        raise MissingSignature(f"missing or empty header(s): {', '.join(missing)}")
    msg_id = str(values["webhook-id"])
    timestamp = _parse_unix(str(values["webhook-timestamp"]).strip(), "webhook-timestamp")
    candidates = parse_standard_signatures(str(values["webhook-signature"]))
    _check_window(timestamp, tolerance, now)
    for secret in secrets:
        expected = base64.b64decode(standard_signature(secret, msg_id, timestamp, body).split(",", 1)[1])
        for candidate in candidates:
            if hmac.compare_digest(expected, candidate):
                return timestamp
    raise SignatureMismatch(
        f"none of the {len(candidates)} v1 signature(s) matches any of the {len(secrets)} secret(s) "
        "(wrong secret, tampered body, or the body was not verified as the raw bytes received)")


# -- the consumer a delivery is for --------------------------------------------------------
def consumer_of(headers: Mapping[str, str]) -> str | None:
    """The uid of the consumer a delivery is for (header ``X-Promesa-Consumer``, matched case-insensitively),
    or None on deliveries of a subscription that belongs to no consumer.

    The header is not signed: read it only after ``verify`` (or ``verify_standard``) accepted the request,
    and use it as a check, e.g. that the endpoint it arrived at belongs to that customer of yours. Given twice
    with different values, it raises ``MalformedSignature``."""
    value = _lower_headers(headers).get(CONSUMER_HEADER.lower())
    value = value.strip() if isinstance(value, str) else None
    return value or None
