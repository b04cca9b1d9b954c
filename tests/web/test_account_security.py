"""A person's account: sign-ins, failures and lockouts are in the audit log (for admins and that person),
sessions end when idle and when old (on the injected clock), new passwords meet one rule wherever they are
set, and a signed-in user changes their own password, which ends their other sessions."""

from __future__ import annotations

import json
import re

import pytest
import sqlalchemy as sa

from dashboard.cli import cli
from dashboard.core.extensions import db
from dashboard.models import AuditEntry, User

from tests.conftest import _csrf_from

SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
STRONG = "lantern orbit cactus"


def sign_in(client, email, password, address="203.0.113.7"):
    token = _csrf_from(client.get("/login").get_data(as_text=True))
    return client.post("/login", data={"email": email, "password": password, "csrf_token": token},
                       environ_base={"REMOTE_ADDR": address})


def entries(action=None) -> list[AuditEntry]:
    db.session.expire_all()
    query = sa.select(AuditEntry).order_by(AuditEntry.id)
    return list(db.session.scalars(query.where(AuditEntry.action == action) if action else query))


def audit_page(client) -> str:
    page = client.get("/audit")
    assert page.status_code == 200
    return page.get_data(as_text=True)


# -- sign-ins in the audit log ---------------------------------------------------------------------------

def test_sign_ins_failures_and_a_lockout_are_audited_without_a_password(app, client, users):
    assert sign_in(client, "member@example.com", "pw-member").status_code == 302
    [ok] = entries("user.signed_in")
    assert (ok.actor_kind, ok.actor, ok.team_id, ok.detail) == ("user", "member@example.com", None,
                                                                {"address": "203.0.113.7"})
    other = app.test_client()
    assert sign_in(other, "nobody@example.com", "hunter2-secret", address="198.51.100.9").status_code == 401
    for _ in range(5):  # the account's limit: 5 per 15 minutes
        assert sign_in(other, "owner@example.com", "guess-secret", address="198.51.100.9").status_code == 401
    assert sign_in(other, "owner@example.com", "guess-secret", address="198.51.100.9").status_code == 429
    assert sign_in(other, "owner@example.com", "guess-secret", address="198.51.100.9").status_code == 429
    failed = entries("user.sign_in_failed")
    assert [(e.actor_kind, e.actor, e.detail["reason"]) for e in failed] == (
        [("anonymous", "nobody@example.com", "no such user")] + [("anonymous", "owner@example.com", "wrong password")] * 5)
    assert {e.detail["address"] for e in failed} == {"198.51.100.9"}
    [locked] = entries("user.locked_out")  # once per window, however many refused tries follow
    assert (locked.actor, locked.detail["locked"], locked.detail["address"]) == (
        "owner@example.com", "this account", "198.51.100.9")
    assert locked.detail["until"] > app.config["CLOCK"].now().isoformat()
    everything = json.dumps([[e.actor, e.target, e.detail] for e in entries()])
    assert "secret" not in everything and "pw-member" not in everything


@SQLITE_ONLY
def test_sign_ins_are_shown_to_admins_and_to_the_person_alone(app, users):
    clients = {role: app.test_client() for role in ("admin", "operator", "owner", "outsider")}
    for role, client in clients.items():
        assert sign_in(client, f"{role}@example.com", f"pw-{role}").status_code == 302
    assert sign_in(app.test_client(), "owner@example.com", "wrong-one").status_code == 401
    admin = audit_page(clients["admin"])
    assert all(f"{role}@example.com" in admin for role in clients) and "(not signed in)" in admin
    for role in ("operator", "owner", "outsider"):
        page = audit_page(clients[role])
        assert f"{role}@example.com" in page and "user.signed_in" in page
        assert [r for r in clients if r != role and f"{r}@example.com" in page] == [], role
    assert "(not signed in)" in audit_page(clients["owner"])  # the failed try at the owner's own account


# -- how long a session lasts ------------------------------------------------------------------------------

@SQLITE_ONLY
def test_a_session_ends_when_idle_and_a_pages_own_polling_does_not_keep_it(app, client, users, clock):
    assert sign_in(client, "oncall@example.com", "pw-oncall").status_code == 302
    for _ in range(11):  # 11 hours of the overview polling itself, nobody at the keyboard
        clock.advance(hours=1)
        assert client.get("/", headers={"HX-Request": "true"}).status_code == 200
    assert client.get("/audit").status_code == 200  # someone opens a page: activity
    clock.advance(hours=11, minutes=59)
    assert client.get("/", headers={"HX-Request": "true"}).status_code == 200
    clock.advance(minutes=2)
    polled = client.get("/", headers={"HX-Request": "true"})
    assert polled.status_code == 401 and polled.headers["HX-Redirect"] == "/login"
    page = client.get("/audit", follow_redirects=True)
    assert page.request.path == "/login" and "Sign in" in page.get_data(as_text=True)


@SQLITE_ONLY
def test_a_session_ends_seven_days_after_its_sign_in_however_busy(app, client, users, clock):
    assert sign_in(client, "operator@example.com", "pw-operator").status_code == 302
    for _ in range(15):  # active every 11 hours: never idle, 6 days 21 hours
        clock.advance(hours=11)
        assert client.get("/audit").status_code == 200
    clock.advance(hours=3, seconds=1)
    page = client.get("/audit", follow_redirects=True)
    assert page.request.path == "/login"
    assert "7 days after you signed in" in page.get_data(as_text=True)


# -- the password rule ---------------------------------------------------------------------------------------

@SQLITE_ONLY
@pytest.mark.parametrize("password, words", [
    ("a", "at least 12"), ("short-one", "at least 12"), ("password1234", "guessers"), ("Summer2026!!", "guessers"),
    ("qwertyuiopasdf", "guessers"), ("abcabcabcabc", "guessers"), ("xxxxxxxxxxxxxxxx", "guessers"),
    ("newbie-newbie-2026", "your own name"),
])
def test_the_cli_refuses_a_weak_password(app, password, words):
    result = app.test_cli_runner().invoke(cli, ["users", "create", "--email", "newbie@example.com", "--role", "oncall", "--password",
                                                password])
    assert result.exit_code != 0 and words in result.output, result.output
    assert db.session.scalar(sa.select(sa.func.count()).select_from(User)) == 0


@SQLITE_ONLY
def test_the_cli_and_the_users_page_set_passwords_that_meet_the_rule(app, client, users, auth):
    from dashboard.accounts.passwords import password_problem

    result = app.test_cli_runner().invoke(cli, ["users", "create", "--email", "ok@example.com", "--role", "oncall",
                                                "--password", STRONG])
    assert result.exit_code == 0, result.output
    assert sign_in(app.test_client(), "ok@example.com", STRONG).status_code == 302
    auth.login("admin")
    page = client.post("/users", data={"email": "new@example.com", "role": "oncall", "csrf_token": auth.csrf()},
                       follow_redirects=True)
    assert page.status_code == 200
    user = db.session.scalar(sa.select(User).where(User.email == "new@example.com"))
    [generated] = re.findall(r'id="one-time-secret">([^<]+)<', page.get_data(as_text=True))  # shown this once
    assert user.check_password(generated) and password_problem(generated, user.email) is None


# -- changing one's own password -------------------------------------------------------------------------------

def change(client, current, new, repeat=None, token=None):
    token = token if token is not None else _csrf_from(client.get("/account/password").get_data(as_text=True))
    return client.post("/account/password", data={"current": current, "new": new, "repeat": new if repeat is None
                                                   else repeat, "csrf_token": token})


def test_a_user_changes_their_password_and_their_other_sessions_end(app, client, users):
    laptop, phone = client, app.test_client()
    for device in (laptop, phone):
        assert sign_in(device, "member@example.com", "pw-member").status_code == 302
    for current, new, repeat, status, words in [
            ("wrong", STRONG, None, 400, "current password is wrong"),
            ("pw-member", "too-short", None, 400, "at least 12"),
            ("pw-member", "Password2026!", None, 400, "guessers"),
            ("pw-member", STRONG, STRONG + "x", 400, "differ")]:
        refused = change(laptop, current, new, repeat)
        assert refused.status_code == status and words in refused.get_data(as_text=True)
    assert change(laptop, "pw-member", STRONG, token="").status_code == 400  # CSRF
    db.session.expire_all()
    assert db.session.get(User, users["member"].id).check_password("pw-member") and not entries(
        "user.password_changed")

    done = change(laptop, "pw-member", STRONG)
    assert done.status_code == 302 and done.headers["Location"] == "/account/password"  # post/redirect/get
    assert "Your password is changed" in laptop.get("/account/password").get_data(as_text=True)
    assert laptop.get("/audit").status_code == 200  # this session goes on
    assert phone.get("/audit").status_code == 302  # the other one has ended
    [changed] = entries("user.password_changed")
    assert (changed.actor, changed.team_id) == ("member@example.com", None) and STRONG not in json.dumps(
        changed.detail)
    assert sign_in(app.test_client(), "member@example.com", "pw-member").status_code == 401
    assert sign_in(app.test_client(), "member@example.com", STRONG).status_code == 302


@SQLITE_ONLY
def test_a_stolen_session_cannot_guess_the_current_password_quickly(app, client, users, clock):
    assert sign_in(client, "owner@example.com", "pw-owner").status_code == 302
    for guess in range(5):
        assert change(client, f"guess-{guess}", STRONG).status_code == 400
    refused = change(client, "pw-owner", STRONG)  # even the right one, until the window has passed
    assert refused.status_code == 429 and "try again in 15 minutes" in refused.get_data(as_text=True)
    db.session.expire_all()
    assert db.session.get(User, users["owner"].id).check_password("pw-owner")
    assert [e.detail["reason"] for e in entries("user.password_change_refused")] == ["wrong current password"] * 5
    clock.advance(minutes=15)
    assert change(client, "pw-owner", STRONG).status_code == 302


@SQLITE_ONLY
def test_the_change_page_needs_a_signed_in_user(client, users):
    assert client.get("/account/password").status_code == 302
    assert client.post("/account/password", data={}).status_code in (302, 400)
