"""Notification sinks (admins): where incidents, automatic disables and finished replays are announced,
each named, with a filter (which teams, which kinds), and a button that sends it a test message."""

from __future__ import annotations

from flask import abort, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required
from markupsafe import Markup, escape
from sqlalchemy import select

from dashboard.accounts import access
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.models import NotificationSink, Team
from dashboard.operations import notifications
from dashboard.web.pages import bp, shown_once


def _page(status: int = 200, **shown):
    teams = db.session.scalars(select(Team.name).where(Team.name != access.SYSTEM_TEAM).order_by(Team.name)).all()
    return render_template("sinks/page.html", sinks=notifications.sinks(), masked=notifications.masked,
                           kinds=notifications.SINK_KINDS, teams=teams,
                           notification_kinds=sorted(notifications.SINK_NOTIFICATIONS),
                           describe_filter=notifications.describe_filter, teams_named=notifications.teams_named,
                           **shown), status


def _sink_or_404(sink_id: str) -> NotificationSink:
    access.require(access.is_admin(current_user))
    sink = db.session.get(NotificationSink, sink_id)
    if sink is None:
        abort(404)
    return sink


def _name_in_form() -> str:
    # The dashboard asks for a name (the CLI may leave it out): notifications call a sink by it.
    name = request.form.get("name", "").strip()
    if not name:
        raise ApiError(400, "give the sink a name, so that people know where notifications go")
    return name


@bp.get("/sinks")
@login_required
def sinks():
    access.require(access.is_admin(current_user))
    kept = shown_once.take("sink")
    created = db.session.get(NotificationSink, kept[0]) if kept else None
    if created is None:
        return _page()
    body, status = _page(created=created, secret=kept[1])
    return body, status, {"Cache-Control": "no-store"}


@bp.post("/sinks")
@login_required
def add_sink():
    # A new sink is a subscription of the system team; its signing secret is shown once, on the page this leads to.
    access.require(access.is_admin(current_user))
    try:
        sink, secret = notifications.add_sink(request.form.get("kind", ""), request.form.get("url", ""),
                                              name=_name_in_form(),
                                              teams=request.form.getlist("teams"), kinds=request.form.getlist("kinds"))
    except ApiError as exc:
        db.session.rollback()
        return _page(exc.status, error=exc.message, form=request.form)
    return shown_once.show_after_redirect("sink", sink.id, secret, url_for(".sinks"),
                                          lambda: _page(201, created=sink, secret=secret))


@bp.post("/sinks/<sink_id>/edit")
@login_required
def change_sink(sink_id):
    # Name and filter only: a new address is a new sink, with a secret of its own.
    sink = _sink_or_404(sink_id)
    try:
        changed = notifications.change_sink(sink, name=_name_in_form(),
                                            teams=request.form.getlist("teams"), kinds=request.form.getlist("kinds"))
    except ApiError as exc:
        db.session.rollback()
        return _page(exc.status, error=exc.message)
    said = ", ".join("notification kinds" if field == "kinds" else field for field in changed)
    flash(f"Sink {sink.name} changed ({said}): it hears {notifications.describe_filter(sink)}." if changed
          else "Nothing changed: the form was as saved.", "ok")
    return redirect(url_for(".sinks"))


@bp.post("/sinks/<sink_id>/test")
@login_required
def test_sink(sink_id):
    # A test message to this sink alone, as a delivery like any notification: its page says how the sink answered.
    sink = _sink_or_404(sink_id)
    delivery_id = notifications.send_test(sink)
    flash(Markup("Test message sent to {}: <a href=\"{}\">see how it answered</a>.").format(
        escape(sink.name or sink.id), url_for(".delivery", delivery_id=delivery_id)), "ok")
    return redirect(url_for(".sinks"))


@bp.post("/sinks/<sink_id>/remove")
@login_required
def remove_sink(sink_id):
    # Removing stops notifications to it; what it was sent stays in its subscription's history.
    notifications.remove_sink(_sink_or_404(sink_id))
    flash("Sink removed: it gets no more notifications.", "ok")
    return redirect(url_for(".sinks"))
