"""Migrations that move data: a database holding rows at the previous head upgrades, and comes back."""

from __future__ import annotations

import shutil
import tempfile

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
    instance = tempfile.mkdtemp(prefix="promesa-migrate-")
    app = create_app({"SQLALCHEMY_DATABASE_URI": empty_database, "TESTING": True, "INSTANCE_PATH": instance})
    try:
        with app.app_context():
            flask_migrate.upgrade(revision=BEFORE_PER_TEAM_IDS)
            with db.engine.begin() as conn:
                for statement in ROWS_AT_THE_OLD_HEAD:
                    conn.execute(sa.text(statement))
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
            db.engine.dispose()
    finally:
        shutil.rmtree(instance, ignore_errors=True)


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
    instance = tempfile.mkdtemp(prefix="promesa-migrate-")
    app = create_app({"SQLALCHEMY_DATABASE_URI": empty_database, "TESTING": True, "INSTANCE_PATH": instance})
    postgresql = empty_database.startswith("postgresql")
    try:
        with app.app_context():
            flask_migrate.upgrade(revision=BEFORE_CONSUMERS)
            with db.engine.begin() as conn:
                for statement in ROWS_BEFORE_CONSUMERS:
                    conn.execute(sa.text(statement))
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
            db.engine.dispose()
    finally:
        shutil.rmtree(instance, ignore_errors=True)
