"""The application factory: configuration, extensions, and each area's `init_app`."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from sqlalchemy import event

from dashboard.core import config as config_module
from dashboard.core.clock import SystemClock
from dashboard.core.extensions import csrf, db, migrate
from dashboard.core.outages import (
    ReconnectingFlask,
    bounded_waits,
    drop_dead_connections,
    note_commits,
)
from dashboard.core.resources import resource_folder
from dashboard.ingest import autocommit
from dashboard.web import api, auth, health, metrics, pages, security

log = logging.getLogger(__name__)


# In the environment once the warning below was said: every process a start launches inherits it and stays quiet.
BASE_URL_SAID = "PROMESA_BASE_URL_SAID"


def say_base_url_unset_once(url: str, env=os.environ) -> None:
    """Warn that PROMESA_BASE_URL is unset once for a whole start (`promesa up`, its web, workers and sweeper,
    and every app each of them makes), not once per process or app."""
    if env.get(BASE_URL_SAID):
        return
    env[BASE_URL_SAID] = "1"
    log.warning("PROMESA_BASE_URL is not set: links in notifications point at %s and work only for people who "
                "open the dashboard at that address; set PROMESA_BASE_URL to the address they use", url)


def serving_at(host: str, port: int, env) -> dict:
    """The environment for the processes that serve the dashboard at host:port (`promesa up`, `promesa web`):
    PROMESA_BASE_URL's default is that address, and the warning when it is unset is said here, once."""
    served = dict(env, **{config_module.SERVED_URL: config_module.served_url(host, port)})
    if not served.get("PROMESA_BASE_URL"):
        say_base_url_unset_once(served[config_module.SERVED_URL], served)
    return served


def create_app(test_config: dict | None = None) -> ReconnectingFlask:
    instance_path = (test_config or {}).get("INSTANCE_PATH") or config_module.instance_folder()
    app = ReconnectingFlask(__name__, instance_path=instance_path, template_folder=str(resource_folder("templates")),
                static_folder=str(resource_folder("static")))
    app.config.update(config_module.DEFAULTS)
    app.config.update(config_module.from_environment(instance_path))
    app.config.update(config_module.overrides_from_environment(config_module.DEFAULTS))
    app.config["CLOCK"] = SystemClock()
    if test_config:
        app.config.update(test_config)
    # Notification links need the dashboard's public address; without it they point at the default.
    app.config["PROMESA_BASE_URL_SET"] = bool(os.environ.get("PROMESA_BASE_URL")) \
        or "PROMESA_BASE_URL" in (test_config or {})
    if not app.config["PROMESA_BASE_URL_SET"]:
        say_base_url_unset_once(app.config["PROMESA_BASE_URL"])
    app.config["SQLALCHEMY_DATABASE_URI"] = config_module.normalize_database_url(app.config["SQLALCHEMY_DATABASE_URI"])
    if app.config.get("MAX_CONTENT_LENGTH") is None:
        app.config["MAX_CONTENT_LENGTH"] = app.config["PROMESA_MAX_BODY_BYTES"]
    if app.config["SQLALCHEMY_DATABASE_URI"].startswith("sqlite"):
        Path(instance_path).mkdir(parents=True, exist_ok=True)
    elif app.config["SQLALCHEMY_DATABASE_URI"].startswith("postgresql+psycopg"):
        app.config["SQLALCHEMY_ENGINE_OPTIONS"] = bounded_waits(app.config["SQLALCHEMY_ENGINE_OPTIONS"],
                                                                app.config["PROMESA_DATABASE_TIMEOUT_SECONDS"])

    db.init_app(app)
    with app.app_context():
        if app.config["SQLALCHEMY_DATABASE_URI"].startswith("sqlite"):
            event.listen(db.engine, "connect", _sqlite_pragmas)
        else:  # a pooled connection the server terminated is replaced before use (web and workers)
            drop_dead_connections(db.engine)
            note_commits(db.engine)
    migrate.init_app(app, db, directory=str(resource_folder("migrations")))
    csrf.init_app(app)
    # Each area wires itself here, and only here.
    security.init_app(app)
    auth.init_app(app)
    api.init_app(app)
    pages.init_app(app)
    metrics.init_app(app)
    health.init_app(app)
    autocommit.init_app(app)
    return app


def _sqlite_pragmas(dbapi_connection, connection_record):
    """SQLite shared by web and workers: WAL lets readers and one writer overlap; wait, don't fail, on a lock."""
    cur = dbapi_connection.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()
