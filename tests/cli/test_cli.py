"""The `promesa` command's account and token management."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select

from dashboard.cli import cli
from dashboard.core.extensions import db
from dashboard.models import ApiToken, User

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


def test_tokens_list_shows_prefix_team_and_dates_never_the_token(runner, clock):
    first = runner.invoke(cli, ["tokens", "create", "--team", "payments"]).output.strip().splitlines()[-1]
    second = runner.invoke(cli, ["tokens", "create", "--team", "search"]).output.strip().splitlines()[-1]
    result = runner.invoke(cli, ["tokens", "list"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].split() == ["prefix", "team", "created", "(UTC)", "revoked", "(UTC)", "last", "used", "(UTC)",
                                "expires", "(UTC)", "name"]
    assert lines[1].split()[:2] == [first[:10], "payments"] and lines[1].split()[-4:] == ["-", "never", "never", "-"]
    assert lines[2].split()[:2] == [second[:10], "search"]
    assert first not in result.output and second not in result.output
    only = runner.invoke(cli, ["tokens", "list", "--team", "search"]).output.strip().splitlines()
    assert len(only) == 2 and only[1].startswith(second[:10])


def test_tokens_create_names_a_token_and_sets_its_expiry(runner, clock):
    result = runner.invoke(cli, ["tokens", "create", "--team", "payments", "--name", "billing", "--expires-in-days", "7"])
    assert result.exit_code == 0, result.output
    token = db.session.scalar(select(ApiToken).where(ApiToken.name == "billing"))
    assert token.expires_at == clock.now() + dt.timedelta(days=7) and token.created_by == "cli"
    listed = runner.invoke(cli, ["tokens", "list"]).output.strip().splitlines()[-1]
    assert listed.split()[-2:] == [f"{token.expires_at:%H:%M}", "billing"]
    assert runner.invoke(cli, ["tokens", "create", "--team", "p", "--expires-in-days", "0"]).exit_code != 0


def test_tokens_revoke_by_prefix_refuses_the_token_at_once(runner, client, clock):
    token = runner.invoke(cli, ["tokens", "create", "--team", "payments"]).output.strip().splitlines()[-1]

    def publish():
        return client.post("/api/v1/events", json={"type": "a.b"}, headers={"Authorization": f"Bearer {token}"})

    assert publish().status_code == 202
    result = runner.invoke(cli, ["tokens", "revoke", token[:10]])
    assert result.exit_code == 0 and f"revoked token {token[:10]} of team payments" in result.output
    assert publish().status_code == 401
    listed = runner.invoke(cli, ["tokens", "list"]).output.strip().splitlines()[1]
    assert listed.split()[4:6] == [f"{clock.now():%Y-%m-%d}", f"{clock.now():%H:%M:%S}"]  # revoked
    assert listed.split()[6:8] == [f"{clock.now():%Y-%m-%d}", f"{clock.now():%H:%M}"]  # last used, by the publish
    again = runner.invoke(cli, ["tokens", "revoke", token])  # the whole token names it too
    assert again.exit_code == 0 and "already revoked" in again.output


def test_tokens_revoke_an_unknown_prefix_fails_without_echoing_a_token(runner):
    result = runner.invoke(cli, ["tokens", "revoke", "pk_doesnotexist-and-a-long-secret-tail"])
    assert result.exit_code != 0 and "no token with the prefix 'pk_doesnot'" in result.output
    assert "secret-tail" not in result.output
