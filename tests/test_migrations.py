"""Migrations that move data: a database holding rows at the previous head upgrades, and comes back."""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager

import flask_migrate
import pytest
import sqlalchemy as sa

from dashboard.app import create_app
from dashboard.core.extensions import db

from .conftest import fresh_postgres_database

BEFORE_PER_TEAM_IDS = "c7a4e9b2d5f1"
ROWS_AT_THE_OLD_HEAD = [
    "INSERT INTO teams (id, name, strict_event_types, created_at) VALUES (1, 't', false, '2026-01-01')",
    "INSERT INTO subscriptions (id, team_id, url, description, event_types, event_versions, retry_policy, "
    "signature_scheme, state, secret_ciphertext, connect_timeout, attempt_timeout, max_age_seconds, created_at, "
    "updated_at) VALUES ('sub_1', 1, 'https://example.com/', '', '[\"*\"]', '{}', 'exponential', 'promesa', "
    "'active', 'c', 5, 10, 86400, '2026-01-01', '2026-01-01')",
    "INSERT INTO events (id, team_id, type, version, data, body, occurred_at, created_at) "
    "VALUES ('order-1', 1, 'a.b', 1, '{}', '{}', '2026-01-01', '2026-01-01')",
    "INSERT INTO deliveries (id, event_id, subscription_id, state, attempt_count, retry_base, created_at, "
    "updated_at) VALUES ('dlv_1', 'order-1', 'sub_1', 'pending', 0, 0, '2026-01-01', '2026-01-01')",
]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_database(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'migrate.db'}"
    else:
        with fresh_postgres_database("promesa_migrate_test") as url:
            yield url


def test_event_ids_become_unique_per_team_and_keep_their_deliveries(empty_database):
    with rows_at(empty_database, BEFORE_PER_TEAM_IDS, ROWS_AT_THE_OLD_HEAD):
        flask_migrate.upgrade()
        with db.engine.begin() as conn:
            assert conn.execute(sa.text('SELECT e."key", e.id, d.event_key FROM deliveries d '
                                        'JOIN events e ON e."key" = d.event_key')).all() == \
                [("order-1", "order-1", "order-1")]
            conn.execute(sa.text("INSERT INTO teams (id, name, strict_event_types, created_at) "
                                 "VALUES (2, 'u', false, '2026-01-01')"))
            conn.execute(sa.text('INSERT INTO events ("key", id, team_id, type, version, data, body, occurred_at, '
                                 "created_at) VALUES ('evt_2', 'order-1', 2, 'a.b', 1, '{}', '{}', '2026-01-01', "
                                 "'2026-01-01')"))  # the same id in another team
        with pytest.raises(sa.exc.IntegrityError), db.engine.begin() as conn:  # the same id in the same team
            conn.execute(sa.text('INSERT INTO events ("key", id, team_id, type, version, data, body, occurred_at, '
                                 "created_at) VALUES ('evt_3', 'order-1', 2, 'a.b', 1, '{}', '{}', '2026-01-01', "
                                 "'2026-01-01')"))
        with pytest.raises(sa.exc.IntegrityError), db.engine.begin() as conn:  # deliveries still need an event
            conn.execute(sa.text("INSERT INTO deliveries (id, event_key, subscription_id, state, attempt_count, "
                                 "retry_base, created_at, updated_at) VALUES ('dlv_2', 'nope', 'sub_1', "
                                 "'pending', 0, 0, '2026-01-01', '2026-01-01')"))
        with db.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM events WHERE team_id = 2"))
        flask_migrate.downgrade(revision=BEFORE_PER_TEAM_IDS)
        with db.engine.begin() as conn:
            assert conn.execute(sa.text("SELECT e.id, d.event_id FROM deliveries d "
                                        "JOIN events e ON e.id = d.event_id")).all() == [("order-1", "order-1")]


BEFORE_CONSUMERS = "b9d3f5a7c1e2"
ROWS_BEFORE_CONSUMERS = [
    "INSERT INTO teams (id, name, strict_event_types, created_at) VALUES (1, 't', false, '2026-01-01')",
    "INSERT INTO subscriptions (id, team_id, url, description, event_types, event_versions, retry_policy, "
    "signature_scheme, state, secret_ciphertext, connect_timeout, attempt_timeout, max_age_seconds, created_at, "
    "updated_at) VALUES ('sub_1', 1, 'https://example.com/', '', '[\"file.*\", \"a.b\"]', '{}', 'exponential', "
    "'promesa', 'active', 'c', 5, 10, 86400, '2026-01-01', '2026-01-01')",
    'INSERT INTO events ("key", id, team_id, type, version, data, body, occurred_at, created_at) '
    "VALUES ('evt_1', 'order-1', 1, 'a.b', 1, '{}', '{}', '2026-01-01', '2026-01-01')",
    "INSERT INTO deliveries (id, event_key, subscription_id, state, attempt_count, retry_base, created_at, "
    "updated_at) VALUES ('dlv_1', 'evt_1', 'sub_1', 'pending', 0, 0, '2026-01-01', '2026-01-01')",
]


def test_consumers_arrive_on_a_database_with_data_which_keeps_routing_as_before(empty_database):
    """Existing subscriptions and events belong to no consumer and route as they did; on PostgreSQL their
    route keys are computed again by the new expression, the same for a subscription of no consumer."""
    postgresql = empty_database.startswith("postgresql")
    with rows_at(empty_database, BEFORE_CONSUMERS, ROWS_BEFORE_CONSUMERS):
        with db.engine.begin() as conn:
            keys_before = conn.execute(sa.text("SELECT route_keys FROM subscriptions")).scalar_one() \
                if postgresql else None
        flask_migrate.upgrade()
        with db.engine.begin() as conn:
            assert conn.execute(sa.text("SELECT consumer_id FROM subscriptions")).all() == [(None,)]
            assert conn.execute(sa.text("SELECT consumer_id FROM events")).all() == [(None,)]
            assert conn.execute(sa.text("SELECT id, state FROM deliveries")).all() == [("dlv_1", "pending")]
            if postgresql:
                assert conn.execute(sa.text("SELECT route_keys FROM subscriptions")).scalar_one() == \
                    keys_before == ["1 *", "1 a.b"]
            conn.execute(sa.text("INSERT INTO consumers (id, team_id, uid, name, state, created_at, updated_at) "
                                 "VALUES (7, 1, 'cus_1', '', 'active', '2026-01-01', '2026-01-01')"))
            conn.execute(sa.text("UPDATE subscriptions SET consumer_id = 7"))
            if postgresql:  # a consumer's subscription is keyed apart from the team's own
                assert conn.execute(sa.text("SELECT route_keys FROM subscriptions")).scalar_one() == \
                    ["1.7 *", "1.7 a.b"]
            conn.execute(sa.text("UPDATE subscriptions SET consumer_id = NULL"))
            conn.execute(sa.text("DELETE FROM consumers"))
        flask_migrate.downgrade(revision=BEFORE_CONSUMERS)
        with db.engine.begin() as conn:
            assert conn.execute(sa.text("SELECT id, state FROM deliveries")).all() == [("dlv_1", "pending")]
            if postgresql:
                assert conn.execute(sa.text("SELECT route_keys FROM subscriptions")).scalar_one() == keys_before
        flask_migrate.upgrade()


BEFORE_PULL = "f4c1a8e3b7d5"
INSERT_PULL = ("INSERT INTO subscriptions (id, team_id, url, mode, description, event_types, event_versions, "
               "retry_policy, signature_scheme, state, secret_ciphertext, connect_timeout, attempt_timeout, "
               "max_age_seconds, created_at, updated_at) VALUES ('sub_2', 1, NULL, 'pull', '', '[\"*\"]', '{}', "
               "'exponential', 'promesa', 'active', 'c', 5, 10, 86400, '2026-01-01', '2026-01-01')")


def test_pull_subscriptions_arrive_without_a_url_and_the_rows_keep_their_deliveries(empty_database):
    """Existing subscriptions become push ones; url loses NOT NULL in place (SQLite: no table rebuild under the
    deliveries' foreign key, which stays enforced); going back refuses while a pull subscription exists."""
    with rows_at(empty_database, BEFORE_PULL, ROWS_BEFORE_CONSUMERS):
        flask_migrate.upgrade()
        with db.engine.begin() as conn:
            assert conn.execute(sa.text("SELECT id, mode FROM subscriptions")).all() == [("sub_1", "push")]
            conn.execute(sa.text(INSERT_PULL))
        with pytest.raises(sa.exc.IntegrityError), db.engine.begin() as conn:  # still a foreign key
            conn.execute(sa.text("DELETE FROM subscriptions WHERE id = 'sub_1'"))
        with pytest.raises(SystemExit):  # flask_migrate logs the RuntimeError, then exits
            flask_migrate.downgrade(revision=BEFORE_PULL)
        with db.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM subscriptions WHERE id = 'sub_2'"))
        flask_migrate.downgrade(revision=BEFORE_PULL)
        with pytest.raises(sa.exc.IntegrityError), db.engine.begin() as conn:  # NOT NULL again
            conn.execute(sa.text(INSERT_PULL.replace("mode, ", "").replace("'pull', ", "")))
        with db.engine.begin() as conn:
            assert conn.execute(sa.text("SELECT id, state FROM deliveries")).all() == [("dlv_1", "pending")]
        flask_migrate.upgrade()


BEFORE_LISTEN = "a7d2e9c4f1b8"


def test_listen_sessions_arrive_as_no_subscription_being_one_and_leave_with_the_rows_kept(empty_database):
    with rows_at(empty_database, BEFORE_LISTEN, ROWS_BEFORE_CONSUMERS + [INSERT_PULL]):
        flask_migrate.upgrade()
        with db.engine.begin() as conn:
            assert conn.execute(sa.text("SELECT id, listen_seen_at FROM subscriptions ORDER BY id")).all() == \
                [("sub_1", None), ("sub_2", None)]
            conn.execute(sa.text("UPDATE subscriptions SET listen_seen_at = '2026-01-02' WHERE id = 'sub_2'"))
        flask_migrate.downgrade(revision=BEFORE_LISTEN)  # the session stays, as a pull subscription
        with db.engine.begin() as conn:
            assert conn.execute(sa.text("SELECT id, mode FROM subscriptions ORDER BY id")).all() == \
                [("sub_1", "push"), ("sub_2", "pull")]
            assert conn.execute(sa.text("SELECT id, state FROM deliveries")).all() == [("dlv_1", "pending")]
        flask_migrate.upgrade()


@contextmanager
def rows_at(database: str, revision: str, rows: list[str]):
    """An app context on `database` migrated to `revision`, holding `rows`."""
    instance = tempfile.mkdtemp(prefix="promesa-migrate-")
    app = create_app({"SQLALCHEMY_DATABASE_URI": database, "TESTING": True, "INSTANCE_PATH": instance})
    try:
        with app.app_context():
            flask_migrate.upgrade(revision=revision)
            with db.engine.begin() as conn:
                for statement in rows:
                    conn.execute(sa.text(statement))
            yield
            db.engine.dispose()
    finally:
        shutil.rmtree(instance, ignore_errors=True)
