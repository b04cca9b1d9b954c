"""`promesa sinks add|list|remove`: notification sinks from the command line (as on the admin page)."""

from __future__ import annotations

import click
from flask.cli import AppGroup

from . import notifications
from .extensions import db
from .models import NotificationSink
from .validation import ApiError

CLI_ACTOR = ("system", "cli")


@click.group("sinks", cls=AppGroup)  # AppGroup: each command runs inside the app context
def sinks_command():
    """Where incidents, automatic disables and finished replays are announced."""


@sinks_command.command("add")
@click.option("--kind", type=click.Choice(notifications.SINK_KINDS), required=True,
              help="slack: a Slack-compatible incoming webhook; json: a thin event, signed like every delivery")
@click.option("--url", required=True)
def sinks_add(kind, url):
    """Add a sink; for a JSON sink, print its signing secret (shown once)."""
    try:
        sink, secret = notifications.add_sink(kind, url, actor=CLI_ACTOR)
    except ApiError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"added {kind} sink {sink.id} -> {notifications.masked(url)}")
    if kind == "json":
        click.echo("signing secret (shown once; verify X-Signature with it):", err=True)
        click.echo(secret)


@sinks_command.command("list")
def sinks_list():
    for sink in notifications.sinks():
        click.echo(f"{sink.id}\t{sink.kind}\t{notifications.masked(sink.subscription.url)}\t"
                   f"subscription {sink.subscription_id}")


@sinks_command.command("remove")
@click.argument("sink_id")
def sinks_remove(sink_id):
    sink = db.session.get(NotificationSink, sink_id)
    if sink is None:
        raise click.ClickException(f"no sink {sink_id}; `promesa sinks list` shows them")
    notifications.remove_sink(sink, actor=CLI_ACTOR)
    click.echo(f"removed sink {sink_id}")
