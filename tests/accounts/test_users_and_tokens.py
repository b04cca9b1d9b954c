"""Users (admins) and tokens (owners for their team, admins for any): secrets shown once, everything audited."""

from __future__ import annotations

import re

from sqlalchemy import select

from dashboard.audit import ACCOUNT_ACTIONS
from dashboard.core.extensions import db
from dashboard.models import ApiToken, AuditEntry, User

from tests.conftest import Auth


def _actions():
    """The actions of the entries so far, without the sign-ins every test makes."""
    return db.session.scalars(select(AuditEntry.action).where(AuditEntry.action.not_in(ACCOUNT_ACTIONS))
                              .order_by(AuditEntry.id)).all()


def test_an_admin_creates_a_user_whose_password_is_shown_once(app, client, auth, users):
    auth.login("admin")
    assert "<option selected>member</option>" in client.get("/users").get_data(as_text=True)  # the least privilege
    token = auth.csrf()
    resp = client.post("/users", data={"csrf_token": token, "email": "New@Example.com", "role": "owner", "team": "acme"})
    assert resp.status_code == 303 and resp.headers["Location"] == "/users"  # a reload shows the page, creates nothing
    cookie = resp.headers["Set-Cookie"].split(";")[0].split("=", 1)[1]
    carried = app.session_interface.get_signing_serializer(app).loads(cookie)
    shown = client.get("/users")
    assert shown.headers["Cache-Control"] == "no-store"
    password = re.search(r'id="one-time-secret">([^<]+)<', shown.get_data(as_text=True)).group(1)
    assert password not in client.get("/users").get_data(as_text=True)
    assert password not in str(carried)  # carried to the next page encrypted
    entry = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "user.created"))
    assert entry.actor == "admin@example.com" and password not in str(entry.detail)

    fresh = app.test_client()
    page = fresh.get("/login").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    assert fresh.post("/login", data={"email": "new@example.com", "password": password, "csrf_token": csrf}).status_code == 302

    assert client.post("/users", data={"csrf_token": token, "email": "new@example.com", "role": "member",
                                       "team": "acme"}).status_code == 409
    assert client.post("/users", data={"csrf_token": token, "email": "x@example.com", "role": "root"}).status_code == 400
    refused = client.post("/users", data={"csrf_token": token, "email": "x@example.com", "role": "owner"})
    assert refused.status_code == 400 and "belongs to a team" in refused.get_data(as_text=True)
    assert db.session.scalar(select(User).where(User.email == "x@example.com")) is None


def test_an_admin_changes_a_role_and_deactivates_a_user_whose_session_then_ends(app, client, auth, users):
    member = app.test_client()
    Auth(member).login("member")
    assert member.get("/").status_code == 200
    auth.login("admin")
    token = auth.csrf()
    member_id, admin_id = users["member"].id, users["admin"].id

    client.post(f"/users/{member_id}/role", data={"csrf_token": token, "role": "oncall", "team": ""})
    db.session.expire_all()
    assert (users["member"].role, users["member"].team_id) == ("oncall", None)
    assert client.post(f"/users/{admin_id}/role", data={"csrf_token": token, "role": "member",
                                                        "team": "acme"}).status_code == 400

    client.post(f"/users/{member_id}/deactivate", data={"csrf_token": token})
    assert "/login" in member.get("/").headers["Location"]  # the open session stopped working
    again = Auth(app.test_client()).login("member")
    assert again.status_code == 403 and "deactivated" in again.get_data(as_text=True)
    client.post(f"/users/{member_id}/reactivate", data={"csrf_token": token})
    assert Auth(app.test_client()).login("member").status_code == 302
    assert _actions()[-3:] == ["user.role_changed", "user.deactivated", "user.reactivated"]


def test_an_owner_creates_and_revokes_a_token_of_their_team_only(app, client, auth, producer, users):
    other_token = db.session.scalar(select(ApiToken))  # the producer's, team acme
    auth.login("outsider")
    assert "No tokens yet" in client.get("/tokens").get_data(as_text=True)  # acme's are not theirs
    assert client.post(f"/tokens/{other_token.id}/revoke", data={"csrf_token": auth.csrf()}).status_code == 404

    auth.login("owner")
    token = auth.csrf()
    resp = client.post("/tokens", data={"csrf_token": token})
    assert resp.status_code == 303 and "one-time-secret" not in resp.get_data(as_text=True)
    resp = client.get(resp.headers["Location"])  # the token is on the page the form leads to, once
    assert resp.status_code == 200 and resp.headers["Cache-Control"] == "no-store"
    plaintext = re.search(r'id="one-time-secret">([^<]+)<', resp.get_data(as_text=True)).group(1)
    api = {"Authorization": f"Bearer {plaintext}"}
    assert client.post("/api/v1/events", json={"type": "a.b"}, headers=api).status_code == 202
    listing = client.get("/tokens").get_data(as_text=True)
    assert plaintext not in listing and plaintext[:10] + "…" in listing

    created = db.session.scalar(select(ApiToken).where(ApiToken.display_prefix == plaintext[:10]))
    client.post(f"/tokens/{created.id}/revoke", data={"csrf_token": token})
    assert client.post("/api/v1/events", json={"type": "a.b"}, headers=api).status_code == 401
    entries = db.session.scalars(select(AuditEntry).where(AuditEntry.action.like("token.%"))).all()
    assert [(e.action, e.actor, e.team_id, e.target) for e in entries] == [
        ("token.created", "owner@example.com", producer.team.id, f"token:{plaintext[:10]}"),
        ("token.revoked", "owner@example.com", producer.team.id, f"token:{plaintext[:10]}")]


def test_an_admin_names_the_team_of_a_new_token(client, auth, producer, users):
    auth.login("admin")
    token = auth.csrf()
    assert client.post("/tokens", data={"csrf_token": token}).status_code == 400
    resp = client.post("/tokens", data={"csrf_token": token, "team": "other"})
    assert resp.status_code == 303 and "New token for other" in client.get("/tokens").get_data(as_text=True)
