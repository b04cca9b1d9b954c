import hashlib
import hmac
import time

TOLERANCE_SECONDS = 300


def verify_promesa_signature(raw_body: bytes, header: str, secret: str, now: float | None = None) -> bool:
    """True when X-Signature is valid for these exact body bytes and recent enough.

    raw_body: the request body exactly as received (never re-serialised JSON).
    header:   the X-Signature header, "t=<unix>,v1=<hex>[,v1=<hex>...]".
    secret:   the subscription's whole secret string, "whsec_...".
    """
    try:
        pairs = [item.split("=", 1) for item in header.split(",")]
        timestamp = int(next(value for key, value in pairs if key == "t"))
        candidates = [value for key, value in pairs if key == "v1"]
    except (ValueError, StopIteration):
        return False
    now = time.time() if now is None else now
    if abs(now - timestamp) > TOLERANCE_SECONDS:
        return False  # too old (a replay) or from the future
    signed = str(timestamp).encode() + b"." + raw_body
    expected = hmac.new(secret.encode("utf-8"), signed, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(expected, candidate) for candidate in candidates)
