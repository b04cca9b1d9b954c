"""/healthz and /readyz with everything up, Redis down, PostgreSQL down and a migration missing;
who sees the details; and what a request gets while the database is away (503, never 500)."""

from __future__ import annotations

import re
import shutil
import socket
import time

import psycopg
import pytest
import redis
import sqlalchemy as sa
from alembic.script import ScriptDirectory

from dashboard.app import create_app
from dashboard.core.outages import database_unavailable
from dashboard.queue import heartbeat
from dashboard.web.health import migration_heads

from dashboard.core.extensions import db
from dashboard.models import User

from tests.conftest import Auth, Producer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NOBODY_REDIS = f"redis://127.0.0.1:{free_port()}/0"
NOBODY_POSTGRES = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/promesa"
OUTSIDE = {"REMOTE_ADDR": "203.0.113.9"}


def app_with(config, **changes):
    return create_app({**config, **changes})


def ready(client, **kwargs):
    started = time.monotonic()
    resp = client.get("/readyz", **kwargs)
    return resp, time.monotonic() - started


def test_healthz_answers_with_every_dependency_away(config):
    app = app_with(config, SQLALCHEMY_DATABASE_URI=NOBODY_POSTGRES, REDIS_URL=NOBODY_REDIS)
    resp = app.test_client().get("/healthz", environ_base=OUTSIDE)
    assert resp.status_code == 200 and resp.get_json() == {"status": "ok"}


def test_readyz_is_ready_and_says_nothing_of_the_configuration(app, client, config):
    resp, _ = ready(client, environ_base=OUTSIDE)
    assert resp.status_code == 200, resp.get_json()
    assert resp.get_json() == {"status": "ready", "missing": []}
    text = resp.get_data(as_text=True)
    for secret in ("127.0.0.1", "sqlite", "postgres", config["PROMESA_REDIS_PREFIX"]):
        assert secret not in text


def test_readyz_with_redis_down(config):
    client = app_with(config, REDIS_URL=NOBODY_REDIS).test_client()
    resp, _ = ready(client, environ_base=OUTSIDE)
    assert resp.status_code == 503
    assert resp.get_json() == {"status": "not ready", "missing": ["redis"]}
    assert "6379" not in resp.get_data(as_text=True) and "redis://" not in resp.get_data(as_text=True)


def test_readyz_with_postgres_down_answers_within_the_timeout(config):
    client = app_with(config, SQLALCHEMY_DATABASE_URI=NOBODY_POSTGRES).test_client()
    resp, took = ready(client, environ_base=OUTSIDE)
    assert resp.status_code == 503
    assert resp.get_json() == {"status": "not ready", "missing": ["database"]}
    assert took < 3


def test_readyz_with_a_migration_missing(config, sqlite_template, tmp_path):
    path = tmp_path / "behind.db"
    shutil.copy(sqlite_template, path)
    engine = sa.create_engine(f"sqlite:///{path}")
    app = app_with(config, SQLALCHEMY_DATABASE_URI=f"sqlite:///{path}")
    (head,) = migration_heads(app)
    previous = ScriptDirectory(app.extensions["migrate"].directory).get_revision(head).down_revision
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": previous})
    engine.dispose()
    resp, _ = ready(app.test_client())
    assert resp.status_code == 503
    assert resp.get_json()["missing"] == ["migrations"]
    verbose = app.test_client().get("/readyz?verbose=1").get_json()
    assert verbose["checks"]["migrations"] == "not at head"


def test_readyz_on_a_database_never_migrated(config, tmp_path):
    client = app_with(config, SQLALCHEMY_DATABASE_URI=f"sqlite:///{tmp_path / 'empty.db'}").test_client()
    resp, _ = ready(client)
    assert resp.status_code == 503 and resp.get_json()["missing"] == ["migrations"]


def test_anonymous_probes_reuse_a_database_connection(app, client):
    """A load balancer asks every few seconds, from several places: each probe must not cost a new connection."""
    opened = []

    def count(dbapi_connection, record):
        opened.append(dbapi_connection)

    sa.event.listen(sa.pool.Pool, "connect", count)  # every pool of the process, however made
    try:
        for _ in range(50):
            assert ready(client, environ_base=OUTSIDE)[0].status_code == 200
    finally:
        sa.event.remove(sa.pool.Pool, "connect", count)
    assert len(opened) <= 1, f"50 probes opened {len(opened)} connections"


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_probe_after_the_server_ended_the_kept_connection_is_still_ready(app, client, database_url):
    assert ready(client, environ_base=OUTSIDE)[0].status_code == 200
    killer = sa.create_engine(database_url)
    with killer.connect() as conn:  # what a restart or a failover does to every connection kept
        ended = conn.execute(sa.text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                     "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalar()
    killer.dispose()
    assert ended >= 1
    assert ready(client, environ_base=OUTSIDE)[0].status_code == 200


def test_verbose_lists_live_workers_for_loopback_and_admins_only(app, client, config, users, auth):
    conn = redis.Redis.from_url(config["REDIS_URL"])
    prefix = config["PROMESA_REDIS_PREFIX"]
    heartbeat.beat(conn, prefix, "worker", "host-a:101", {"database": "ok"})
    heartbeat.beat(conn, prefix, "sweeper", "host-b:202", {"last_pass": 1.0})
    heartbeat.beat(conn, prefix, "worker", "host-c:303", ttl=1)
    time.sleep(1.1)  # the third one's beat expires (a Redis TTL: no clock to inject)

    body = client.get("/readyz?verbose=1").get_json()  # the test client is 127.0.0.1
    assert body["checks"] == {"database": "ok", "redis": "ok", "migrations": "at head"}
    assert re.fullmatch(r"127\.0\.0\.1:\d+|unix socket /\S+", body["redis_server"])  # which Redis, no password
    assert [w["name"] for w in body["workers"]] == ["host-a:101"]
    assert [s["name"] for s in body["sweepers"]] == ["host-b:202"]

    outside = client.get("/readyz?verbose=1", environ_base=OUTSIDE).get_json()
    assert outside == {"status": "ready", "missing": []}
    auth.login("operator")
    assert "workers" not in client.get("/readyz?verbose=1", environ_base=OUTSIDE).get_json()
    auth.login("admin")
    assert [w["name"] for w in client.get("/readyz?verbose=1", environ_base=OUTSIDE).get_json()["workers"]] \
        == ["host-a:101"]


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_with_postgres_away_ingest_and_pages_answer_503_never_500(config):
    good = create_app(config)
    signed_in = good.test_client()
    with good.app_context():
        token = Producer(signed_in, "health").token
        user = User(email="admin@example.com", role="admin")
        user.set_password("pw-admin")
        db.session.add(user)
        db.session.commit()
        Auth(signed_in).login("admin")
    away = app_with(config, SQLALCHEMY_DATABASE_URI=NOBODY_POSTGRES).test_client()

    resp = away.post("/api/v1/events", json={"type": "file.updated", "data": {}},
                     headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 503
    assert resp.headers["Retry-After"].isdigit()
    assert resp.get_json() == {"error": "the database is unavailable; retry later"}

    away.set_cookie("session", signed_in.get_cookie("session").value)  # a signed-in user's next page
    page = away.get("/")
    assert page.status_code == 503 and page.headers["Retry-After"].isdigit()
    assert "Database unavailable, retrying" in page.get_data(as_text=True)


def test_a_bad_statement_is_still_a_500_not_an_outage(app):
    with app.app_context():
        try:
            with app.extensions["sqlalchemy"].engine.connect() as conn:
                conn.execute(sa.text("SELECT * FROM no_such_table"))
        except sa.exc.DBAPIError as error:
            assert not database_unavailable(error)
        else:
            pytest.fail("the statement ran")


def test_the_database_away_under_another_error_is_a_503_and_a_bug_stays_a_json_500(config):
    app = app_with(config, PROPAGATE_EXCEPTIONS=False)  # as served: an unhandled error becomes a 500

    def pool_gave_up():
        try:
            raise psycopg.OperationalError("connection failed: the database system is shutting down")
        except psycopg.OperationalError as error:
            raise sa.exc.InvalidRequestError("This connection is closed") from error

    def pool_exhausted():
        raise sa.exc.InvalidRequestError("This connection is closed")  # the pool's, with no cause attached

    def bug():
        raise KeyError("a bug")

    app.add_url_rule("/api/v1/_test/pool", view_func=pool_gave_up)
    app.add_url_rule("/api/v1/_test/exhausted", view_func=pool_exhausted)
    app.add_url_rule("/api/v1/_test/bug", view_func=bug)
    client = app.test_client()
    away = client.get("/api/v1/_test/pool")
    assert away.status_code == 503 and away.headers["Retry-After"].isdigit()
    assert client.get("/api/v1/_test/exhausted").status_code == 503
    broken = client.get("/api/v1/_test/bug")
    assert broken.status_code == 500 and broken.is_json and "error" in broken.get_json()


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_request_whose_connection_dies_before_its_teardown_keeps_its_answer(config):
    """An ingest with an Idempotency-Key reads in a transaction, then writes in autocommit and answers 202;
    the database going away before the request's end must not turn that into a 500 at teardown."""
    app = create_app(config)  # no app context held: each request has its own, as when served

    def read_then_lose_the_connection():
        db.session.execute(sa.text("SELECT 1"))  # a transaction is open on the session's connection
        pid = db.session.execute(sa.text("SELECT pg_backend_pid()")).scalar()
        admin = sa.create_engine(config["SQLALCHEMY_DATABASE_URI"], poolclass=sa.pool.NullPool)
        with admin.connect() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        admin.dispose()
        time.sleep(0.2)  # the backend exits
        return "accepted", 202

    app.add_url_rule("/_test/lost-before-teardown", view_func=read_then_lose_the_connection)
    resp = app.test_client().get("/_test/lost-before-teardown")
    assert resp.status_code == 202
    with app.app_context():  # and the next request's session works
        assert db.session.execute(sa.text("SELECT 1")).scalar() == 1
        db.engine.dispose()
