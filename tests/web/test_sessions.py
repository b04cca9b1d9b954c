"""Dashboard sessions, sign-in and what every response tells the browser: sign-out ends the session on
the server, sign-in starts a fresh one, failed sign-ins are throttled, `next` stays on this site,
cookies and security headers."""

from __future__ import annotations

import hashlib

import pytest

from dashboard.app import create_app
from dashboard.core.extensions import db
from dashboard.models import Subscription
from dashboard.web.security import CONTENT_SECURITY_POLICY

from tests.conftest import _csrf_from

SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@pytest.fixture
def sub(producer, receiver, users):
    return producer.subscribe(receiver.url + "/status/500")


@pytest.fixture
def site(config, users):
    """A second app instance on the same database and Redis. Its requests each get their own app
    context, so nothing (Flask-Login's user in `g`) carries over from one request to the next."""
    return create_app(config)


def csrf_on(client, path="/") -> str:
    return _csrf_from(client.get(path).get_data(as_text=True))


def sign_in(client, email, password, next_path=None, address="127.0.0.1"):
    token = _csrf_from(client.get("/login").get_data(as_text=True))
    url = "/login" + (f"?next={next_path}" if next_path is not None else "")
    return client.post(url, data={"email": email, "password": password, "csrf_token": token},
                       environ_base={"REMOTE_ADDR": address})


def state_of(sub) -> str:
    db.session.expire_all()
    return db.session.get(Subscription, sub["id"]).state


# -- sign-out ends the session on the server ---------------------------------------------------
@SQLITE_ONLY
def test_a_cookie_copied_before_sign_out_no_longer_works(site, sub):
    client = site.test_client()
    assert sign_in(client, "operator@example.com", "pw-operator").status_code == 302
    token = csrf_on(client)
    copied = client.get_cookie("session").value
    assert client.post("/logout", data={"csrf_token": token}).status_code == 302

    thief = site.test_client()
    thief.set_cookie("session", copied)
    page = thief.get("/")
    assert page.status_code == 302 and "/login" in page.headers["Location"]
    resp = thief.post(f"/subscriptions/{sub['id']}/pause", data={"csrf_token": token})
    assert resp.status_code == 302 and "/login" in resp.headers["Location"]
    assert state_of(sub) == "active"


@SQLITE_ONLY
def test_signing_in_again_after_sign_out_works(site):
    client = site.test_client()
    sign_in(client, "admin@example.com", "pw-admin")
    client.post("/logout", data={"csrf_token": csrf_on(client)})
    assert client.get("/").status_code == 302
    assert sign_in(client, "admin@example.com", "pw-admin").status_code == 302
    assert client.get("/").status_code == 200


@SQLITE_ONLY
def test_a_csrf_token_from_before_sign_in_is_refused_after_it(site, sub):
    client = site.test_client()
    before = csrf_on(client, "/login")
    resp = client.post("/login", data={"email": "operator@example.com", "password": "pw-operator",
                                       "csrf_token": before})
    assert resp.status_code == 302
    resp = client.post(f"/subscriptions/{sub['id']}/pause", data={"csrf_token": before})
    assert resp.status_code == 400 and state_of(sub) == "active"
    after = csrf_on(client)
    assert after != before
    assert client.post(f"/subscriptions/{sub['id']}/pause", data={"csrf_token": after}).status_code == 302
    assert state_of(sub) == "paused"


# -- failed sign-ins are throttled ----------------------------------------------------------------
@SQLITE_ONLY
def test_failed_sign_ins_are_throttled_per_account(site):
    client = site.test_client()
    for _ in range(5):
        assert sign_in(client, "admin@example.com", "wrong").status_code == 401
    resp = sign_in(client, "Admin@Example.com", "pw-admin")  # the right password no longer helps
    assert resp.status_code == 429
    assert "Too many failed sign-ins for this account" in resp.get_data(as_text=True)
    assert 0 < int(resp.headers["Retry-After"]) <= 15 * 60
    assert sign_in(client, "admin@example.com", "pw-admin", address="10.0.0.9").status_code == 429
    assert sign_in(site.test_client(), "operator@example.com", "pw-operator").status_code == 302  # another account


@SQLITE_ONLY
def test_signing_in_forgives_the_accounts_earlier_typos(site):
    for _ in range(4):
        assert sign_in(site.test_client(), "admin@example.com", "typo").status_code == 401
    assert sign_in(site.test_client(), "admin@example.com", "pw-admin").status_code == 302
    for _ in range(4):
        assert sign_in(site.test_client(), "admin@example.com", "typo").status_code == 401
    assert sign_in(site.test_client(), "admin@example.com", "pw-admin").status_code == 302


@SQLITE_ONLY
def test_failed_sign_ins_are_throttled_per_address_across_web_processes(app, config, users):
    # Two app instances stand for two gunicorn workers: they share the count through Redis.
    config = {**config, "PROMESA_LOGIN_LIMIT_PER_ADDRESS": "3 per 15 minutes"}
    first, second = create_app(config).test_client(), create_app(config).test_client()
    for n in range(3):
        assert sign_in(first, f"nobody{n}@example.com", "guess", address="192.0.2.7").status_code == 401
    resp = sign_in(second, "admin@example.com", "pw-admin", address="192.0.2.7")
    assert resp.status_code == 429 and "Too many failed sign-ins for this address" in resp.get_data(as_text=True)
    assert sign_in(second, "admin@example.com", "pw-admin", address="192.0.2.8").status_code == 302


@SQLITE_ONLY
def test_an_unknown_email_costs_one_password_hash_like_a_known_one(client, users, monkeypatch):
    hashes = []
    real_scrypt = hashlib.scrypt

    def counting_scrypt(*args, **kwargs):
        hashes.append(1)
        return real_scrypt(*args, **kwargs)

    sign_in(client, "warm-up@example.com", "x", address="10.1.0.1")  # the dummy hash is made once per process
    monkeypatch.setattr(hashlib, "scrypt", counting_scrypt)
    assert sign_in(client, "admin@example.com", "wrong", address="10.1.0.2").status_code == 401
    known = len(hashes)
    assert sign_in(client, "nobody@example.com", "wrong", address="10.1.0.3").status_code == 401
    assert known == 1 and len(hashes) - known == known


# -- next stays on this site; odd input is a 4xx -------------------------------------------------
@SQLITE_ONLY
@pytest.mark.parametrize("next_path", ["%2F%09%2Fevil.example%2F", "//evil.example/", "/%5Cevil.example/",
                                       "%5C%5Cevil.example", "https://evil.example/", "/%0A/evil.example",
                                       "/x%0D%0ASet-Cookie:%20a=b", "javascript:alert(1)"])
def test_sign_in_never_redirects_off_site(site, next_path):
    resp = sign_in(site.test_client(), "admin@example.com", "pw-admin", next_path=next_path)
    assert resp.status_code == 302 and resp.headers["Location"] == "/"


@SQLITE_ONLY
def test_sign_in_keeps_a_local_next(site):
    resp = sign_in(site.test_client(), "admin@example.com", "pw-admin", next_path="/subscriptions/sub_x%3Fstate%3Dheld")
    assert resp.headers["Location"] == "/subscriptions/sub_x?state=held"


def test_a_nul_in_the_email_is_a_400(site):
    client = site.test_client()
    token = _csrf_from(client.get("/login").get_data(as_text=True))
    resp = client.post("/login", data=f"email=a%00b&password=x&csrf_token={token}",
                       content_type="application/x-www-form-urlencoded")
    assert resp.status_code == 400 and "NUL" in resp.get_data(as_text=True)  # refused before sign-in reads it


@pytest.mark.parametrize("path", ["/subscriptions/sub%00x", "/deliveries/dlv%00x", "/subscriptions/sub_x?state=a%00b",
                                  "/?a%00=b", "/login?next=%2F%00%2Fx"])
def test_a_nul_in_a_page_address_is_a_400(site, path):
    client = site.test_client()
    sign_in(client, "admin@example.com", "pw-admin")
    resp = client.get(path)
    assert resp.status_code == 400 and "NUL" in resp.get_data(as_text=True)


# -- cookies --------------------------------------------------------------------------------------
def session_cookie(resp) -> str:
    cookies = [c for c in resp.headers.getlist("Set-Cookie") if c.startswith("session=")]
    assert cookies, resp.headers
    return cookies[0]


@SQLITE_ONLY
def test_the_session_cookie_is_lax_httponly_and_secure_over_https(site):
    plain = session_cookie(sign_in(site.test_client(), "admin@example.com", "pw-admin"))
    assert "SameSite=Lax" in plain and "HttpOnly" in plain and "Secure" not in plain
    https = site.test_client()
    token = _csrf_from(https.get("/login", base_url="https://localhost").get_data(as_text=True))
    resp = https.post("/login", base_url="https://localhost",
                      data={"email": "admin@example.com", "password": "pw-admin", "csrf_token": token},
                      headers={"Referer": "https://localhost/login"})
    assert resp.status_code == 302 and "; Secure" in session_cookie(resp)


@SQLITE_ONLY
@pytest.mark.parametrize("trusted_proxies, secure", [(0, False), (1, True)])
def test_x_forwarded_proto_counts_only_behind_a_configured_proxy(config, users, trusted_proxies, secure):
    client = create_app({**config, "PROMESA_TRUSTED_PROXIES": trusted_proxies}).test_client()
    resp = client.get("/login", headers={"X-Forwarded-Proto": "https"})
    assert ("; Secure" in session_cookie(resp)) is secure


# -- security headers -----------------------------------------------------------------------------
@SQLITE_ONLY
def test_every_page_carries_the_security_headers(client, auth, producer, sub):
    anonymous = [client.get("/login"), client.get("/nothing-here"), client.get("/")]
    auth.login("operator")
    pages = [client.get("/"), client.get("/", headers={"HX-Request": "true"}),
             client.get(f"/subscriptions/{sub['id']}")]
    api = [producer.post("/api/v1/subscriptions", {"url": "http://127.0.0.1:9/hook"}), producer.get("/api/v1/events")]
    for resp in anonymous + pages + api:
        assert resp.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.headers["Referrer-Policy"] == "same-origin"
        assert resp.headers["Cache-Control"] == "no-store"
    assert "secret" in api[0].get_json()  # the answer that shows a signing secret once is never cached


@SQLITE_ONLY
def test_static_files_may_be_cached(client):
    resp = client.get("/static/promesa.css")
    assert resp.status_code == 200 and "no-store" not in resp.headers.get("Cache-Control", "")
    assert resp.headers["X-Content-Type-Options"] == "nosniff"


def test_gunicorn_leaves_forwarded_headers_to_the_app():
    from gunicorn.config import Config

    from dashboard.web import server as webserver

    cfg = Config()
    cfg.set("forwarded_allow_ips", webserver.forwarded_allow_ips)
    assert cfg.forwarded_allow_ips == []  # its default trusts 127.0.0.1 to say "https"


@SQLITE_ONLY
def test_the_api_neither_reads_nor_sets_the_dashboard_session(site, producer):
    """The producer API answers to its bearer token alone: a signed-in browser's cookie gives it nothing,
    and its answers set no cookie and do not vary by one."""
    browser = site.test_client()
    assert sign_in(browser, "admin@example.com", "pw-admin").status_code == 302
    cookie_only = browser.post("/api/v1/events", json={"type": "a.b"})
    assert cookie_only.status_code == 401 and "missing bearer token" in cookie_only.get_json()["error"]
    accepted = browser.post("/api/v1/events", json={"type": "a.b"}, headers=producer.headers())
    assert accepted.status_code == 202
    for resp in (cookie_only, accepted):
        assert "Set-Cookie" not in resp.headers and "Cookie" not in resp.headers.get("Vary", "")
    assert browser.get("/").status_code == 200  # the dashboard session itself is untouched
