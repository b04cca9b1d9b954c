"""`promesa sinks add|list|change|test|remove`: notification sinks from the command line (as on the admin page)."""

from __future__ import annotations

import click
from flask.cli import AppGroup

from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.models import NotificationSink
from dashboard.operations import notifications

CLI_ACTOR = ("system", "cli")


@click.group("sinks", cls=AppGroup)  # AppGroup: each command runs inside the app context
def sinks_command():
    """Where incidents, automatic disables and finished replays are announced."""


@sinks_command.command("add")
@click.option("--kind", type=click.Choice(notifications.SINK_KINDS), required=True,
              help="slack: a Slack-compatible incoming webhook; json: a thin event, signed like every delivery")
@click.option("--url", required=True)
@click.option("--name", default="", help="what people call it: #payments-oncall")
@click.option("--team", "teams", multiple=True, help="hear only this team's notifications (repeat for several)")
@click.option("--only", "kinds", multiple=True, type=click.Choice(sorted(notifications.SINK_NOTIFICATIONS)),
              help="hear only this kind of notification (repeat for several)")
def sinks_add(kind, url, name, teams, kinds):
    """Add a sink; for a JSON sink, print its signing secret (shown once)."""
    try:
        sink, secret = notifications.add_sink(kind, url, actor=CLI_ACTOR, name=name, teams=list(teams),
                                              kinds=list(kinds))
    except ApiError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"added {kind} sink {sink.id} -> {notifications.masked(url)}")
    if kind == "json":
        click.echo("signing secret (shown once; verify X-Signature with it):", err=True)
        click.echo(secret)


@sinks_command.command("list")
def sinks_list():
    for sink in notifications.sinks():
        click.echo(f"{sink.id}\t{sink.name or '-'}\t{sink.kind}\t{notifications.masked(sink.subscription.url)}\t"
                   f"{notifications.describe_filter(sink)}\tsubscription {sink.subscription_id}")


def _sink(sink_id: str) -> NotificationSink:
    sink = db.session.get(NotificationSink, sink_id)
    if sink is None:
        raise click.ClickException(f"no sink {sink_id}; `promesa sinks list` shows them")
    return sink


@sinks_command.command("change")
@click.argument("sink_id")
@click.option("--name", default=None, help="a new name (left out: the name stays)")
@click.option("--team", "teams", multiple=True, help="hear only this team's notifications (repeat for several)")
@click.option("--every-team", is_flag=True, help="hear every team's notifications, and Promesa's own")
@click.option("--only", "kinds", multiple=True, type=click.Choice(sorted(notifications.SINK_NOTIFICATIONS)),
              help="hear only this kind of notification (repeat for several)")
@click.option("--every-kind", is_flag=True, help="hear every kind of notification")
def sinks_change(sink_id, name, teams, every_team, kinds, every_kind):
    """Change a sink's name or filter; what is left out stays as it is."""
    if (teams and every_team) or (kinds and every_kind):
        raise click.UsageError("--team and --every-team (or --only and --every-kind) contradict each other")
    sink = _sink(sink_id)
    try:
        changed = notifications.change_sink(
            sink, actor=CLI_ACTOR, name=sink.name if name is None else name,
            teams=[] if every_team else list(teams) or notifications.teams_named(sink.team_ids),
            kinds=[] if every_kind else list(kinds) or sink.kinds)
    except ApiError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"changed sink {sink_id}: {', '.join(changed)}; it hears {notifications.describe_filter(sink)}"
               if changed else f"sink {sink_id} already is that: nothing changed")


@sinks_command.command("remove")
@click.argument("sink_id")
def sinks_remove(sink_id):
    notifications.remove_sink(_sink(sink_id), actor=CLI_ACTOR)
    click.echo(f"removed sink {sink_id}")


@sinks_command.command("test")
@click.argument("sink_id")
def sinks_test(sink_id):
    """Send the sink a test message (a delivery like any notification: retried, recorded)."""
    delivery_id = notifications.send_test(_sink(sink_id), actor=CLI_ACTOR)
    click.echo(f"test message queued for sink {sink_id}: delivery {delivery_id}")
