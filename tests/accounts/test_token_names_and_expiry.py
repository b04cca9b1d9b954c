"""Tokens have a name, a creator, a last use (written at most once a minute, outside the routing tables)
and an optional expiry, after which the API answers 401 saying the token expired."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from sqlalchemy import select, text

from dashboard.core.extensions import db
from dashboard.models import ApiToken, ApiTokenUse, AuditEntry


def _create(client, auth, **form):
    resp = client.post("/tokens", data={"csrf_token": auth.csrf(), **form})
    assert resp.status_code == 303 and resp.headers["Location"] == "/tokens", resp.get_data(as_text=True)
    resp = client.get("/tokens")
    return re.search(r'id="one-time-secret">([^<]+)<', resp.get_data(as_text=True)).group(1)


def _last_use(plaintext):
    token = db.session.scalar(select(ApiToken).where(ApiToken.token_sha256 == ApiToken.digest(plaintext)))
    db.session.expire_all()
    use = db.session.get(ApiTokenUse, token.id)
    return use.last_used_at if use else None


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_named_token_shows_who_made_it_and_when_it_was_last_used(app, client, auth, producer, users, clock):
    auth.login("owner")
    plaintext = _create(client, auth, name="billing producer", expires_in_days="30")
    token = db.session.scalar(select(ApiToken).where(ApiToken.name == "billing producer"))
    assert token.created_by == "owner@example.com"
    assert token.expires_at == clock.now() + dt.timedelta(days=30)
    listing = client.get("/tokens").get_data(as_text=True)
    assert "billing producer" in listing and "by owner@example.com" in listing
    assert re.search(r"<td>billing producer</td>.*?class=\"last-used\">never<", listing, re.S)

    api = {"Authorization": f"Bearer {plaintext}"}
    first = clock.now()
    assert client.post("/api/v1/events", json={"type": "a.b"}, headers=api).status_code == 202
    assert _last_use(plaintext) == first
    clock.advance(seconds=30)
    assert client.get("/api/v1/subscriptions", headers=api).status_code == 200
    assert _last_use(plaintext) == first  # at most once a minute
    clock.advance(seconds=31)
    assert client.get("/api/v1/subscriptions", headers=api).status_code == 200
    assert _last_use(plaintext) == first + dt.timedelta(seconds=61)
    listing = client.get("/tokens").get_data(as_text=True)
    row = re.search(r"<tr [^>]*data-name=\"billing producer\".*?</tr>", listing, re.S).group(0)
    assert re.search(r'class="last-used">([^<]+)<', row).group(1) == \
        (first + dt.timedelta(seconds=61)).strftime("%Y-%m-%d %H:%M")
    [created] = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "token.created",
                                                           AuditEntry.actor == "owner@example.com"))
    assert created.detail["name"] == "billing producer" and "expires_at" in created.detail
    assert plaintext not in str(created.detail)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_bad_token_form_is_a_400_and_makes_nothing(client, auth, producer, users):
    auth.login("owner")
    before = db.session.scalar(select(text("count(*)")).select_from(ApiToken))
    assert client.post("/tokens", data={"csrf_token": auth.csrf(), "expires_in_days": "-3"}).status_code == 400
    assert client.post("/tokens", data={"csrf_token": auth.csrf(), "name": "x" * 101}).status_code == 400
    assert client.post("/tokens", data={"csrf_token": auth.csrf(), "name": "two\nlines"}).status_code == 400
    assert db.session.scalar(select(text("count(*)")).select_from(ApiToken)) == before


def test_an_expired_token_is_told_it_expired(app, client, auth, producer, users, clock):
    auth.login("owner")
    plaintext = _create(client, auth, name="short", expires_in_days="1")
    api = {"Authorization": f"Bearer {plaintext}"}
    assert client.post("/api/v1/events", json={"type": "a.b"}, headers=api).status_code == 202  # kept routing
    clock.advance(days=1)
    for resp in (client.post("/api/v1/events", json={"type": "a.b"}, headers=api),
                 client.get("/api/v1/subscriptions", headers=api)):
        assert resp.status_code == 401
        assert "expired" in resp.get_json()["error"]
    auth.login("owner")  # a day later the dashboard session has ended too (idle)
    assert "expired" in client.get("/tokens").get_data(as_text=True)
    unknown = {"Authorization": "Bearer pk_nothing"}
    assert "revoked" in client.get("/api/v1/subscriptions", headers=unknown).get_json()["error"]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_recording_a_last_use_does_not_move_the_routing_generation(app, client, auth, producer, users, clock):
    generation = text("SELECT generation FROM promesa_routing_generation")
    before = db.session.scalar(generation)
    db.session.commit()
    api = producer.headers()
    db.session.commit()  # no transaction held: ingest takes its own autocommit path, as in production
    assert client.post("/api/v1/events", json={"type": "a.b"}, headers=api).status_code == 202
    db.session.expire_all()
    assert db.session.scalar(select(ApiTokenUse.last_used_at)) == clock.now()
    clock.advance(minutes=2)
    assert client.get("/api/v1/subscriptions", headers=api).status_code == 200
    db.session.expire_all()
    assert db.session.scalar(select(ApiTokenUse.last_used_at)) == clock.now()
    assert db.session.scalar(generation) == before  # the kept routing of every process stays
