"""The `promesa` command's account and token management."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dashboard.cli import cli
from dashboard.extensions import db
from dashboard.models import User

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@pytest.fixture
def runner(app):
    return app.test_cli_runner()


def test_tokens_create_prints_a_working_token_last(runner, client):
    result = runner.invoke(cli, ["tokens", "create", "--team", "payments"])
    assert result.exit_code == 0, result.output
    token = result.output.strip().splitlines()[-1]
    resp = client.post("/api/v1/events", json={"type": "a.b"}, headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 202


def test_users_create_with_a_generated_password(runner, client):
    result = runner.invoke(cli, ["users", "create", "--email", "Ops@Example.com", "--role", "operator"])
    assert result.exit_code == 0, result.output
    password = result.output.strip().rsplit(" ", 1)[-1]
    user = db.session.scalar(select(User).where(User.email == "ops@example.com"))
    assert user.role == "operator" and user.check_password(password)
    again = runner.invoke(cli, ["users", "create", "--email", "ops@example.com"])
    assert again.exit_code != 0 and "already exists" in again.output


def test_users_create_accepts_oncall_and_is_audited_as_the_cli(runner):
    from dashboard.models import AuditEntry

    result = runner.invoke(cli, ["users", "create", "--email", "pager@example.com", "--role", "oncall"])
    assert result.exit_code == 0, result.output
    assert db.session.scalar(select(User.role).where(User.email == "pager@example.com")) == "oncall"
    entry = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "user.created"))
    assert (entry.actor_kind, entry.actor, entry.target) == ("system", "cli", "user:pager@example.com")
    teamless = runner.invoke(cli, ["users", "create", "--email", "m@example.com", "--role", "member"])
    assert teamless.exit_code != 0 and "belongs to a team" in teamless.output
