"""Secret rotation with a grace period: at most two secrets sign, the newest and the one before it.

During the grace every delivery carries a signature made with each (`t=…,v1=<new>,v1=<old>`;
Standard Webhooks: `v1,<new> v1,<old>`), so a receiver switches its secret whenever it likes and no
delivery fails. The previous secret stays encrypted at rest, signs nothing once its grace has
ended (whatever the sweeper has done yet), and the sweeper deletes it then.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from flask import current_app
from promesa_receiver import signing
from sqlalchemy import select, update

from dashboard import audit
from dashboard.core import crypto
from dashboard.core.clock import iso
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.models import AuditEntry, Subscription, previous_signs

DEFAULT_GRACE_SECONDS = 24 * 3600
MAX_GRACE_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class SigningSecret:
    """One secret that signs, described without its value."""
    which: str  # "current" or "previous"
    until: dt.datetime | None  # None: until the next rotation


def signing_secrets(sub: Subscription, now: dt.datetime) -> list[SigningSecret]:
    out = [SigningSecret("current", None)]
    if sub.previous_secret_ciphertext and previous_signs(sub.previous_secret_expires_at, now):
        out.append(SigningSecret("previous", sub.previous_secret_expires_at))
    return out


def rotate(sub: Subscription, grace_seconds: int = DEFAULT_GRACE_SECONDS) -> str:
    """A new secret signs from now on; the current one keeps signing for `grace_seconds` (0: not at all).
    A previous secret still in its grace is dropped: at most two sign. Returns the new secret (shown once)."""
    if sub.deleted_at is not None:
        raise ApiError(409, "this subscription is deleted")
    now = current_app.config["CLOCK"].now()
    replaced_grace = previous_signs(sub.previous_secret_expires_at, now) and bool(sub.previous_secret_ciphertext)
    secret = signing.new_secret()
    if grace_seconds > 0:
        sub.previous_secret_ciphertext = sub.secret_ciphertext
        sub.previous_secret_expires_at = now + dt.timedelta(seconds=grace_seconds)
    else:
        sub.previous_secret_ciphertext = sub.previous_secret_expires_at = None
    sub.secret_ciphertext = crypto.encrypt(secret)
    sub.updated_at = now
    audit.record("subscription.secret_rotated", subscription=sub, detail={
        "grace_seconds": grace_seconds, "previous_signs_until": iso(sub.previous_secret_expires_at),
        "dropped_an_older_secret_in_grace": replaced_grace})
    db.session.commit()
    return secret


def end_grace(sub: Subscription) -> bool:
    """Only the newest secret signs from now on; the previous one is deleted. False if none was signing."""
    now = current_app.config["CLOCK"].now()
    had = bool(sub.previous_secret_ciphertext) and previous_signs(sub.previous_secret_expires_at, now)
    if sub.previous_secret_ciphertext is None:
        return False
    sub.previous_secret_ciphertext = sub.previous_secret_expires_at = None
    sub.updated_at = now
    if had:
        audit.record("subscription.grace_ended", subscription=sub, detail={"by": "request"})
    db.session.commit()
    return had


def delete_expired(now: dt.datetime) -> int:
    """The sweeper's part: previous secrets whose grace has ended are deleted (encrypted until then)."""
    expired = db.session.execute(
        select(Subscription.id, Subscription.team_id)
        .where(Subscription.previous_secret_ciphertext.is_not(None), Subscription.previous_secret_expires_at <= now)
    ).all()
    if not expired:
        return 0
    db.session.execute(
        update(Subscription).where(Subscription.id.in_([r.id for r in expired]),
                                   Subscription.previous_secret_expires_at <= now)
        .values(previous_secret_ciphertext=None, previous_secret_expires_at=None))
    db.session.add_all(AuditEntry(**audit.entry_values(
        "subscription.grace_ended", at=now, team_id=row.team_id, subscription_id=row.id, detail={"by": "expiry"}))
        for row in expired)
    db.session.commit()
    return len(expired)
