"""A pull subscription's own key: it pulls and acks that subscription and nothing else.

The client that fetches a subscription's deliveries (a back office, a consumer's system) needs no team token,
which would reach every subscription and consumer of the team. The key is shown once, when the subscription is
made and when it is replaced; only its SHA-256 and first characters are kept, as for API tokens.
"""

from __future__ import annotations

import hashlib
import secrets

from flask import current_app
from sqlalchemy import select

from dashboard import audit
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.models import Subscription, SubscriptionMode

PREFIX = "pull_"  # (team tokens begin "pk_")
DISPLAY_LENGTH = 10


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def is_pull_key(token: str) -> bool:
    return token.startswith(PREFIX)


def issue(sub: Subscription) -> str:
    """A new key for this pull subscription (the one before stops working with the caller's commit)."""
    key = PREFIX + secrets.token_urlsafe(32)
    sub.pull_key_sha256, sub.pull_key_prefix = digest(key), key[:DISPLAY_LENGTH]
    return key


def replace(sub: Subscription) -> str:
    """Replace the key at once (a leaked key, a client gone); written to the audit log. The new key, shown once."""
    if sub.deleted_at is not None:
        raise ApiError(409, "this subscription is deleted: its history stays readable, nothing else changes")
    if sub.mode != SubscriptionMode.PULL:
        raise ApiError(409, "this is a push subscription: it has no pull key (its deliveries are POSTed to its URL)")
    had = sub.pull_key_prefix
    key = issue(sub)
    sub.updated_at = current_app.config["CLOCK"].now()
    audit.record("subscription.pull_key_replaced", subscription=sub,
                 detail={"previous": had, "new": sub.pull_key_prefix})
    db.session.commit()
    return key


def subscription_of(key: str) -> Subscription | None:
    """The live subscription this key pulls, or None (no such key, replaced, or its subscription deleted)."""
    sub = db.session.scalar(select(Subscription).where(Subscription.pull_key_sha256 == digest(key)))
    return sub if sub is not None and sub.deleted_at is None else None
