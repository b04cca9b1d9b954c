"""Template filters for times, rates and subscriptions' names, so every page says them the same way."""

from __future__ import annotations

import datetime as dt

from flask import current_app
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import Subscription
from dashboard.subscriptions.diagnosis import readable_ms
from dashboard.web.pages import bp


@bp.app_template_filter("age")
def age(since: dt.datetime | None, now: dt.datetime) -> str:
    """How long ago, in the largest unit that says it: "45 s", "12 min", "3 h 5 min", "2 d 4 h"."""
    if since is None:
        return "—"
    seconds = max(0, int((now - since).total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


@bp.app_template_filter("utc")
def utc(when: dt.datetime | None, seconds: bool = True) -> str:
    if when is None:
        return "—"
    return when.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


@bp.app_template_filter("percent")
def percent(rate: float | None) -> str:
    """A success rate: "99.5 %", "100 %", or "—" with no attempts to rate."""
    if rate is None:
        return "—"
    value = rate * 100
    return f"{value:.0f} %" if value in (0, 100) else f"{min(value, 99.9):.1f} %"


@bp.app_template_filter("measured_ms")
def measured_ms(ms: int | None) -> str:
    """A measured time: "40 ms", "1.2 s", or "—" when nothing was measured."""
    return "—" if ms is None else readable_ms(ms)


@bp.app_template_global("listen_idle")
def listen_idle() -> str:
    """How long a listen session may go without a pull before the sweeper deletes it: "10 min"."""
    return age(dt.datetime.min, dt.datetime.min + dt.timedelta(seconds=current_app.config["PROMESA_LISTEN_IDLE_SECONDS"]))


# A description longer than this is cut in a subscription's name (a select's option, a table's cell).
NAMED_DESCRIPTION_CHARS = 60


@bp.app_template_global("subscription_label")
def subscription_label(sub) -> str:
    """A subscription's name where several may share a URL: "billing hook · sub_01J… — https://…"."""
    described = sub.description or ""
    if len(described) > NAMED_DESCRIPTION_CHARS:
        described = described[:NAMED_DESCRIPTION_CHARS - 1] + "…"
    return f"{described} · {sub.id} — {sub.target}" if described else f"{sub.id} — {sub.target}"


@bp.app_template_global("subscriptions_named")
def subscriptions_named(rows) -> dict:
    """The subscriptions of these rows (audit entries, replays: anything with a `subscription_id`) by id, read
    at once, for `subscription_label`. The caller shows only rows the user may see, and so their subscriptions."""
    ids = {row.subscription_id for row in rows if row.subscription_id}
    if not ids:
        return {}
    return {sub.id: sub for sub in db.session.scalars(select(Subscription).where(Subscription.id.in_(ids)))}
