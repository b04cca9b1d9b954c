"""Notification sinks (admins): where incidents, automatic disables and finished replays are announced."""

from __future__ import annotations

from flask import abort, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from .. import access, notifications
from ..extensions import db
from ..models import NotificationSink
from ..validation import ApiError
from . import bp


@bp.get("/sinks")
@login_required
def sinks():
    access.require(access.is_admin(current_user))
    return render_template("sinks/page.html", sinks=notifications.sinks(), masked=notifications.masked,
                           kinds=notifications.SINK_KINDS)


@bp.post("/sinks")
@login_required
def add_sink():
    # A new sink is a subscription of the system team; its signing secret is shown on this answer only.
    access.require(access.is_admin(current_user))
    try:
        sink, secret = notifications.add_sink(request.form.get("kind", ""), request.form.get("url", ""))
    except ApiError as exc:
        return render_template("sinks/page.html", sinks=notifications.sinks(), masked=notifications.masked,
                               kinds=notifications.SINK_KINDS, error=exc.message), exc.status
    return render_template("sinks/page.html", sinks=notifications.sinks(), masked=notifications.masked,
                           kinds=notifications.SINK_KINDS, created=sink, secret=secret), 201


@bp.post("/sinks/<sink_id>/remove")
@login_required
def remove_sink(sink_id):
    # Removing stops notifications to it; what it was sent stays in its subscription's history.
    access.require(access.is_admin(current_user))
    sink = db.session.get(NotificationSink, sink_id)
    if sink is None:
        abort(404)
    notifications.remove_sink(sink)
    flash("Sink removed: it gets no more notifications.", "ok")
    return redirect(url_for(".sinks"))
