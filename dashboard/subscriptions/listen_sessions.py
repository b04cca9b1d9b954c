"""Listen sessions (issue 40): the temporary pull subscriptions `promesa-receiver listen` makes for itself.

A session ends when its command does (Ctrl-C deletes it through the API). One whose command died without
ending it (killed, a laptop closed) stops pulling; the sweeper deletes it once it has not pulled for
PROMESA_LISTEN_IDLE_SECONDS, as the API's delete does: audited as `system`, its waiting deliveries cancelled.
"""

from __future__ import annotations

import datetime as dt

from flask import current_app
from sqlalchemy import select

from dashboard import audit
from dashboard.core.extensions import db
from dashboard.models import Subscription
from dashboard.subscriptions.service import delete

# Sessions deleted per sweeper pass at most; the rest wait for the next pass.
PER_PASS = 500


def delete_idle(now: dt.datetime) -> list[str]:
    """Delete every listen session not pulled for PROMESA_LISTEN_IDLE_SECONDS; their ids."""
    idle = current_app.config["PROMESA_LISTEN_IDLE_SECONDS"]
    sessions = db.session.scalars(
        select(Subscription).where(Subscription.listen_seen_at < now - dt.timedelta(seconds=idle),
                                   Subscription.deleted_at.is_(None))
        .order_by(Subscription.listen_seen_at).limit(PER_PASS)).all()
    for sub in sessions:
        delete(sub, actor=audit.SYSTEM, reason=f"listen session idle: not pulled for {idle:g} seconds "
                                               f"(since {sub.listen_seen_at:%Y-%m-%d %H:%M:%S} UTC)")
    return [sub.id for sub in sessions]
