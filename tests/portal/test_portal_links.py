"""The way in to the consumer portal: a link from the producer signs one browser in, once; the session ends when
the link would have expired, when the producer revokes it, or when the consumer is disabled or deleted."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry, PortalLink

from tests.support.portal import link_path, open_portal


@pytest.fixture
def consumer(producer):
    producer.put_consumer("cus_1", name="Initech")
    return "cus_1"


def test_a_link_is_shown_once_stored_as_a_hash_and_lasts_an_hour_by_default(app, producer, consumer, clock):
    resp = producer.post("/api/v1/consumers/cus_1/portal-links", {})
    assert resp.status_code == 201
    body = resp.get_json()
    assert body["url"].startswith(app.config["PROMESA_BASE_URL"] + "/portal/in/")
    token = body["url"].rsplit("/", 1)[1]
    assert len(token) >= 40
    link = db.session.scalar(select(PortalLink))
    assert token not in (link.token_hash, link.session_hash) and link.token_hash != ""
    assert (link.expires_at - clock.now()).total_seconds() == 3600
    assert body["expires_at"] == link.expires_at.isoformat(timespec="seconds") + "Z" or body["expires_at"].startswith(
        link.expires_at.isoformat(timespec="seconds"))
    entry = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "portal.link_created"))
    assert entry.actor_kind == "token" and token not in str(entry.detail)


@pytest.mark.parametrize("expires_in, status", [(59, 400), (60, 201), (604800, 201), (604801, 400), ("60", 400)])
def test_a_link_lasts_from_a_minute_to_seven_days(producer, consumer, expires_in, status):
    resp = producer.post("/api/v1/consumers/cus_1/portal-links", {"expires_in": expires_in})
    assert resp.status_code == status, resp.get_json()
    if status == 400:
        assert "expires_in" in resp.get_json()["error"]
        assert db.session.scalar(select(PortalLink)) is None


def test_no_link_for_a_consumer_that_is_not_there_or_disabled(producer, consumer):
    assert producer.post("/api/v1/consumers/cus_nobody/portal-links", {}).status_code == 404
    producer.put_consumer("cus_1", state="disabled")
    resp = producer.post("/api/v1/consumers/cus_1/portal-links", {})
    assert resp.status_code == 409 and "disabled" in resp.get_json()["error"]


def test_the_first_use_signs_in_and_a_second_use_is_refused_with_a_page_that_says_so(app, producer, consumer):
    path = link_path(producer, "cus_1")
    first = app.test_client()
    resp = first.get(path)
    assert resp.status_code == 302 and resp.headers["Location"].endswith("/portal/")
    cookie = resp.headers["Set-Cookie"]
    assert cookie.startswith("promesa_portal=") and "Path=/portal" in cookie and "HttpOnly" in cookie
    home = first.get("/portal/")
    assert home.status_code == 200 and "Your webhook endpoints" in home.get_data(as_text=True)

    again = app.test_client().get(path)
    assert again.status_code == 410
    assert "used already" in again.get_data(as_text=True)
    assert first.get("/portal/").status_code == 200  # the first browser keeps its session
    entry = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "portal.signed_in"))
    assert (entry.actor_kind, entry.actor) == ("portal", "cus_1")


def test_the_browser_it_signed_in_may_open_its_link_again_and_stays_in(app, producer, consumer):
    browser = app.test_client()
    path = open_portal(browser, producer, "cus_1")
    again = browser.get(path)  # a reloaded frame
    assert again.status_code == 302 and again.headers["Location"].endswith("/portal/")
    assert browser.get("/portal/").status_code == 200
    other = app.test_client()
    open_portal(other, producer, "cus_1")
    assert other.get(path).status_code == 410  # another session's link: used already, and this session ends
    assert other.get("/portal/").status_code == 401


def test_an_unknown_link_is_refused(client):
    resp = client.get("/portal/in/not-a-token")
    assert resp.status_code == 410 and "not a portal link" in resp.get_data(as_text=True)


def test_over_https_the_cookie_works_inside_a_frame(app, producer, consumer):
    path = link_path(producer, "cus_1")
    resp = app.test_client().get(path, base_url="https://localhost")
    cookie = resp.headers["Set-Cookie"]
    assert "Secure" in cookie and "SameSite=None" in cookie and "Partitioned" in cookie


def test_the_session_ends_when_the_link_would_have_expired(app, producer, consumer, clock):
    browser = app.test_client()
    open_portal(browser, producer, "cus_1", expires_in=600)
    clock.advance(seconds=599)
    assert browser.get("/portal/").status_code == 200
    clock.advance(seconds=2)
    resp = browser.get("/portal/")
    assert resp.status_code == 401 and "session has ended" in resp.get_data(as_text=True)


def test_an_expired_link_opens_nothing(app, producer, consumer, clock):
    path = link_path(producer, "cus_1", expires_in=60)
    clock.advance(seconds=61)
    resp = app.test_client().get(path)
    assert resp.status_code == 410 and "expired" in resp.get_data(as_text=True)


def test_revoking_ends_every_session_and_every_unused_link(app, producer, consumer, users):
    browsers = [app.test_client(), app.test_client()]
    for browser in browsers:
        open_portal(browser, producer, "cus_1")
    unused = link_path(producer, "cus_1")
    resp = producer.client.delete("/api/v1/consumers/cus_1/portal-sessions", headers=producer.headers())
    assert resp.status_code == 200 and resp.get_json() == {"revoked": 3}
    for browser in browsers:
        assert browser.get("/portal/").status_code == 401
    resp = app.test_client().get(unused)
    assert resp.status_code == 410 and "revoked" in resp.get_data(as_text=True)


@pytest.mark.parametrize("how", ["disable", "delete"])
def test_disabling_or_deleting_the_consumer_ends_its_sessions(app, producer, consumer, how):
    browser = app.test_client()
    open_portal(browser, producer, "cus_1")
    if how == "disable":
        producer.put_consumer("cus_1", state="disabled")
    else:
        assert producer.client.delete("/api/v1/consumers/cus_1", headers=producer.headers()).status_code == 200
    assert browser.get("/portal/").status_code == 401
    if how == "disable":  # enabling it again does not bring an ended session back
        producer.put_consumer("cus_1", state="active")
        assert browser.get("/portal/").status_code == 401


def test_leaving_ends_this_session(app, producer, consumer):
    browser = app.test_client()
    open_portal(browser, producer, "cus_1")
    home = browser.get("/portal/").get_data(as_text=True)
    token = home.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    assert browser.post("/portal/leave", data={"csrf_token": token}).status_code == 200
    assert browser.get("/portal/").status_code == 401


def test_a_change_without_the_portal_sessions_csrf_token_is_refused(app, producer, consumer):
    browser = app.test_client()
    open_portal(browser, producer, "cus_1")
    assert browser.post("/portal/leave").status_code == 400
    assert browser.get("/portal/").status_code == 200


def test_what_a_consumer_does_in_its_portal_reads_as_portal_uid_in_the_teams_audit_log(
        app, client, auth, users, producer, consumer, receiver):
    sub = producer.subscribe(receiver.url + "/ok", consumer="cus_1")
    browser = app.test_client()
    open_portal(browser, producer, "cus_1")
    page = browser.get(f"/portal/subscriptions/{sub['id']}").get_data(as_text=True)
    token = page.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    assert browser.post(f"/portal/subscriptions/{sub['id']}/pause", data={"csrf_token": token,
                                                                          "reason": "moving"}).status_code == 302
    auth.login("owner")
    audit = client.get("/audit").get_data(as_text=True)
    assert "<code>portal:cus_1</code>" in audit
