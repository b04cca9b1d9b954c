"""The application factory: configuration, extensions, blueprints."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import event

from . import config as config_module
from . import websecurity
from .clock import SystemClock
from .extensions import csrf, db, login_manager, migrate
from .outages import ReconnectingFlask, drop_dead_connections, note_commits

ROOT = Path(__file__).resolve().parent.parent


def create_app(test_config: dict | None = None) -> ReconnectingFlask:
    instance_path = (test_config or {}).get("INSTANCE_PATH") or os.environ.get("PROMESA_INSTANCE_PATH") \
        or str(ROOT / "instance")
    app = ReconnectingFlask(__name__, instance_path=instance_path, template_folder=str(ROOT / "templates"),
                static_folder=str(ROOT / "static"))
    app.config.update(config_module.DEFAULTS)
    app.config.update(config_module.from_environment(instance_path))
    app.config.update(config_module.overrides_from_environment(config_module.DEFAULTS))
    app.config["CLOCK"] = SystemClock()
    if test_config:
        app.config.update(test_config)
    app.config["SQLALCHEMY_DATABASE_URI"] = config_module.normalize_database_url(app.config["SQLALCHEMY_DATABASE_URI"])
    if app.config.get("MAX_CONTENT_LENGTH") is None:
        app.config["MAX_CONTENT_LENGTH"] = app.config["PROMESA_MAX_BODY_BYTES"]
    if app.config["SQLALCHEMY_DATABASE_URI"].startswith("sqlite"):
        Path(instance_path).mkdir(parents=True, exist_ok=True)

    db.init_app(app)
    with app.app_context():
        if app.config["SQLALCHEMY_DATABASE_URI"].startswith("sqlite"):
            event.listen(db.engine, "connect", _sqlite_pragmas)
        else:  # a pooled connection the server terminated is replaced before use (web and workers)
            drop_dead_connections(db.engine)
            note_commits(db.engine)
    migrate.init_app(app, db, directory=str(ROOT / "migrations"))
    login_manager.init_app(app)
    login_manager.login_view = "auth.login"
    csrf.init_app(app)
    websecurity.init_app(app)

    from .api import bp as api_bp
    from .auth import bp as auth_bp
    from .metrics import bp as metrics_bp
    from .pages import bp as pages_bp

    app.register_blueprint(api_bp)
    csrf.exempt(api_bp)  # the API authenticates with bearer tokens, not cookies
    app.register_blueprint(auth_bp)
    app.register_blueprint(pages_bp)
    app.register_blueprint(metrics_bp)
    from . import ingest_path

    ingest_path.init_app(app)
    return app


def _sqlite_pragmas(dbapi_connection, connection_record):
    """SQLite shared by web and workers: WAL lets readers and one writer overlap; wait, don't fail, on a lock."""
    cur = dbapi_connection.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()
