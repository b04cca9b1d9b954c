import base64
import hashlib
import hmac
import time

TOLERANCE_SECONDS = 300


def verify_standard_webhook(raw_body: bytes, headers: dict, secret: str, now: float | None = None) -> bool:
    """True when the Standard Webhooks headers are valid for these exact body bytes.

    headers: webhook-id, webhook-timestamp, webhook-signature ("v1,<base64>" entries, space-separated).
    secret:  the subscription's secret, "whsec_<base64>"; the key is the decoded base64 part.
    """
    lower = {key.lower(): value for key, value in headers.items()}
    msg_id, timestamp = lower.get("webhook-id", ""), lower.get("webhook-timestamp", "")
    if not msg_id or not timestamp.isdigit():
        return False
    now = time.time() if now is None else now
    if abs(now - int(timestamp)) > TOLERANCE_SECONDS:
        return False  # too old (a replay) or from the future
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + raw_body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(
        version == "v1" and hmac.compare_digest(expected, signature)
        for version, _, signature in (entry.partition(",") for entry in lower.get("webhook-signature", "").split())
    )
