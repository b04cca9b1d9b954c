"""`promesa teams list|quotas|quota`: teams and their quotas from the command line (as on the /quotas page)."""

from __future__ import annotations

import click
from flask.cli import AppGroup
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.ingest import quotas
from dashboard.models import Team

CLI_ACTOR = ("system", "cli")


@click.group("teams", cls=AppGroup)  # AppGroup: each command runs inside the app context
def teams_command():
    """Teams and their quotas."""


def _team(name: str) -> Team:
    team = db.session.scalar(select(Team).where(Team.name == name))
    if team is None:
        raise click.ClickException(f"no team {name!r}; `promesa teams list` shows them")
    return team


@teams_command.command("list")
def teams_list():
    """Every team, with the quotas an admin set for it."""
    for team in db.session.scalars(select(Team).order_by(Team.name)):
        own = quotas.overrides(team.id)
        click.echo(f"{team.name}\t" + (", ".join(f"{k}={v}" for k, v in sorted(own.items())) or "defaults"))


@teams_command.command("quotas")
@click.argument("team_name")
def teams_quotas(team_name):
    """A team's quotas: each one's limit, default, and what the team uses."""
    for name, shown in quotas.describe(_team(team_name)).items():
        used = "" if shown["used"] is None else f"\tused {shown['used']}"
        own = " (own)" if shown["overridden"] else ""
        click.echo(f"{name}\t{shown['limit']}{own}\tdefault {shown['default']}{used}")


@teams_command.command("quota")
@click.argument("team_name")
@click.argument("name", type=click.Choice(list(quotas.QUOTAS)))
@click.argument("value")
def teams_quota(team_name, name, value):
    """Set a team's own value of one quota; VALUE `default` removes it."""
    team = _team(team_name)
    if value == "default":
        number = None
    else:
        try:
            number = int(value.replace("_", ""))
        except ValueError:
            raise click.ClickException(f"{name} must be a whole number, or `default`") from None
    try:
        quotas.set_override(team, name, number, actor=CLI_ACTOR)
    except ApiError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"team {team.name}: {name} = {quotas.limit(team.id, name)}" + (" (the default)" if number is None else ""))
