"""The dashboard: who may see and do what, CSRF on every change, receiver text escaped."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import Subscription

from tests.support.pipeline import deliver_due

SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
pytestmark = SQLITE_ONLY  # page logic does not depend on the database; the core tests cover both


@pytest.fixture
def sub(producer, receiver, users):
    return producer.subscribe(receiver.url + "/status/500")


@pytest.mark.parametrize("path", ["/", "/subscriptions/sub_x", "/deliveries/dlv_x"])
def test_pages_require_login(client, path):
    resp = client.get(path)
    assert resp.status_code == 302 and "/login" in resp.headers["Location"]


@pytest.mark.parametrize("action", ["pause", "resume", "replay"])
def test_actions_require_login(client, action):
    assert client.post(f"/subscriptions/sub_x/{action}").status_code in (302, 400)


def test_it_signs_in_and_out(client, auth, users):
    assert auth.login("admin").status_code == 302
    assert client.get("/").status_code == 200
    assert client.get("/logout").status_code == 405  # a link cannot sign you out
    client.post("/logout", data={"csrf_token": auth.csrf()})
    assert client.get("/").status_code == 302


def test_wrong_password_is_refused(client, auth, users):
    page = client.get("/login")
    from tests.conftest import _csrf_from

    resp = client.post("/login", data={"email": "admin@example.com", "password": "nope",
                                       "csrf_token": _csrf_from(page.get_data(as_text=True))})
    assert resp.status_code == 401 and b"Wrong email or password" in resp.data


def test_login_never_redirects_off_site(client, users):
    from tests.conftest import _csrf_from

    token = _csrf_from(client.get("/login").get_data(as_text=True))
    resp = client.post("/login?next=//evil.example/", data={"email": "admin@example.com", "password": "pw-admin",
                                                             "csrf_token": token})
    assert resp.headers["Location"] == "/"


@pytest.mark.parametrize("role, sees", [("admin", True), ("operator", True), ("owner", True), ("member", True),
                                        ("outsider", False)])
def test_who_sees_a_subscription(client, auth, sub, role, sees):
    auth.login(role)
    assert (sub["id"] in client.get("/").get_data(as_text=True)) is sees
    assert client.get(f"/subscriptions/{sub['id']}").status_code == (200 if sees else 404)


@pytest.mark.parametrize("role, status", [("admin", 302), ("operator", 302), ("owner", 302), ("member", 403),
                                          ("outsider", 404)])
def test_who_may_pause(client, auth, sub, role, status):
    auth.login(role)
    resp = client.post(f"/subscriptions/{sub['id']}/pause", data={"csrf_token": auth.csrf()})
    assert resp.status_code == status
    assert db.session.get(Subscription, sub["id"]).state == ("paused" if status == 302 else "active")


def test_state_changes_need_the_csrf_token(client, auth, sub):
    auth.login("operator")
    resp = client.post(f"/subscriptions/{sub['id']}/pause")
    assert resp.status_code == 400
    db.session.expire_all()
    assert db.session.get(Subscription, sub["id"]).state == "active"
    resp = client.post(f"/subscriptions/{sub['id']}/pause", headers={"X-CSRFToken": auth.csrf()})
    assert resp.status_code == 302  # htmx sends the token as a header


def test_pause_resume_and_replay_from_the_dashboard(app, client, auth, producer, receiver, users, clock):
    s = producer.subscribe(receiver.url + "/status/400")
    event_id = producer.publish()["id"]
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(hours=1)
    auth.login("operator")
    page = client.get(f"/subscriptions/{s['id']}?state=dead").get_data(as_text=True)
    assert "dead" in page and "Replay all dead letters" in page
    resp = client.post(f"/subscriptions/{s['id']}/replay", data={"csrf_token": auth.csrf()}, follow_redirects=True)
    assert b"Replaying 1 dead delivery." in resp.data
    deliver_due(app, clock)
    assert receiver.count() == 4
    client.post(f"/subscriptions/{s['id']}/pause", data={"csrf_token": auth.csrf()})
    producer.publish()
    deliver_due(app, clock)
    assert receiver.count() == 4
    resp = client.post(f"/subscriptions/{s['id']}/resume", data={"csrf_token": auth.csrf()}, follow_redirects=True)
    # the replayed delivery (waiting for its next retry) and the new one were both held by the pause
    assert b"Resumed: 2 held deliveries" in resp.data
    assert event_id


def test_receiver_text_is_escaped(app, client, auth, producer, users, clock):
    """A receiver controls its response body; the page must show it, never run it."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Evil(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b"<script>alert('pwned')</script>"
            self.send_response(500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Evil)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        s = producer.subscribe(f"http://127.0.0.1:{server.server_address[1]}/<b>hook</b>")
        producer.publish()
        deliver_due(app, clock)
    finally:
        server.shutdown()
    auth.login("admin")
    sub_page = client.get(f"/subscriptions/{s['id']}").get_data(as_text=True)
    assert "<b>hook</b>" not in sub_page and "&lt;b&gt;hook&lt;/b&gt;" in sub_page
    delivery_id = db.session.scalar(select(Subscription).where(Subscription.id == s["id"])).id
    from dashboard.models import Delivery

    d = db.session.scalar(select(Delivery).where(Delivery.subscription_id == delivery_id))
    page = client.get(f"/deliveries/{d.id}").get_data(as_text=True)
    assert "<script>alert" not in page and "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;" in page


def test_the_overview_serves_its_table_alone_to_htmx(client, auth, sub):
    auth.login("operator")
    full = client.get("/").get_data(as_text=True)
    assert "<html" in full and 'hx-trigger="poll" data-poll-seconds="5"' in full
    partial = client.get("/", headers={"HX-Request": "true"}).get_data(as_text=True)
    assert "<html" not in partial and sub["id"] in partial
