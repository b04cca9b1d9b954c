"""Embedding the consumer portal in the producer's product: only the team's allowed origins may frame it (CSP
frame-ancestors, and no X-Frame-Options DENY beside them), on every portal answer a team can be known for: a
session's pages, the link being opened or refused, the page of a session that ended. Its look: the team's name,
logo (its host allowed as an image source) and accent colour (/portal/theme.css)."""

from __future__ import annotations

import re

import pytest

from dashboard.consumers import portal
from dashboard.core.extensions import db

from tests.support.portal import link_path, open_portal

# Headers and styles, not SQL.
pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

ORIGIN = "https://app.example.com"


@pytest.fixture
def consumer(producer):
    producer.put_consumer("cus_1", name="Initech")
    return "cus_1"


def allow(producer, **settings):
    portal.update_settings(producer.team, given=frozenset(settings), **settings)


def frame_ancestors(resp) -> str:
    policy = resp.headers["Content-Security-Policy"]
    found = re.search(r"frame-ancestors ([^;]*)", policy)
    assert found, policy
    return found.group(1)


def assert_framable_by(resp, origins: str):
    assert frame_ancestors(resp) == origins
    assert "X-Frame-Options" not in resp.headers  # DENY beside it would win in browsers that read both


def assert_not_framable(resp):
    assert frame_ancestors(resp) == "'none'"
    assert resp.headers["X-Frame-Options"] == "DENY"


def test_a_sessions_pages_may_be_framed_by_the_teams_origins_only(app, producer, consumer):
    allow(producer, frame_ancestors=[ORIGIN, "http://localhost:8080"])
    browser = app.test_client()
    open_portal(browser, producer, "cus_1")
    for path in ("/portal/", "/portal/theme.css"):
        resp = browser.get(path)
        assert resp.status_code == 200
        assert_framable_by(resp, f"http://localhost:8080 {ORIGIN}")
    assert_framable_by(browser.get("/portal/subscriptions/sub_nothere"), f"http://localhost:8080 {ORIGIN}")  # a 404
    # The rest of the policy is the dashboard's.
    policy = browser.get("/portal/").headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "form-action 'self'" in policy and "object-src 'none'" in policy


def test_without_allowed_origins_the_portal_is_not_framed(app, producer, consumer):
    browser = app.test_client()
    open_portal(browser, producer, "cus_1")
    assert_not_framable(browser.get("/portal/"))


def test_the_link_being_opened_answers_with_its_teams_policy(app, producer, consumer):
    allow(producer, frame_ancestors=[ORIGIN])
    path = link_path(producer, "cus_1")
    opened = app.test_client().get(path)
    assert opened.status_code == 302
    assert_framable_by(opened, ORIGIN)
    # Opened again (in the producer's iframe, say): the page that says it was used shows in that frame too.
    again = app.test_client().get(path)
    assert again.status_code == 410 and "used already" in again.get_data(as_text=True)
    assert_framable_by(again, ORIGIN)


@pytest.fixture
def framed(app, producer, consumer):
    """A browser in cus_1's portal, which the team lets ORIGIN frame."""
    allow(producer, frame_ancestors=[ORIGIN])
    browser = app.test_client()
    open_portal(browser, producer, "cus_1")
    return browser


def test_the_page_of_a_revoked_session_keeps_its_teams_policy(framed, producer):
    browser = framed
    assert producer.client.delete("/api/v1/consumers/cus_1/portal-sessions",
                                  headers=producer.headers()).get_json() == {"revoked": 1}
    ended = browser.get("/portal/")
    assert ended.status_code == 401 and "session has ended" in ended.get_data(as_text=True)
    assert_framable_by(ended, ORIGIN)


def test_leaving_shows_its_page_in_the_teams_frame(framed):
    browser = framed
    token = re.search(r'name="csrf_token" value="([^"]+)"', browser.get("/portal/").get_data(as_text=True)).group(1)
    left = browser.post("/portal/leave", data={"csrf_token": token})
    assert left.status_code == 200 and "You have left" in left.get_data(as_text=True)
    assert_framable_by(left, ORIGIN)


def test_no_team_no_frame(app, producer, consumer):
    allow(producer, frame_ancestors=[ORIGIN])
    nobody = app.test_client()
    assert_not_framable(nobody.get("/portal/in/not-a-token"))  # no link: no team to ask
    assert_not_framable(nobody.get("/portal/"))  # no session
    assert_not_framable(nobody.get("/portal/theme.css"))
    # The dashboard is never framed, whatever a team allows for its portal.
    assert_not_framable(nobody.get("/login"))


def test_the_header_shows_the_teams_name_and_logo_and_the_logos_host_may_serve_it(app, producer, consumer):
    allow(producer, logo_url="https://cdn.example.net/brand/logo.svg?v=2")
    browser = app.test_client()
    open_portal(browser, producer, "cus_1")
    resp = browser.get("/portal/")
    page = resp.get_data(as_text=True)
    header = page[page.index('<header class="top portal-top">'):page.index("</header>")]
    assert 'src="https://cdn.example.net/brand/logo.svg?v=2"' in header and "acme" in header
    assert "img-src 'self' data: https://cdn.example.net;" in resp.headers["Content-Security-Policy"]
    allow(producer, logo_url=None)
    resp = browser.get("/portal/")
    assert "portal-logo" not in resp.get_data(as_text=True)
    assert "img-src 'self' data:;" in resp.headers["Content-Security-Policy"]


def test_the_team_name_is_escaped_in_the_header(app, producer, consumer):
    producer.team.name = "acme <b>&</b>"
    db.session.commit()
    browser = app.test_client()
    open_portal(browser, producer, "cus_1")
    page = browser.get("/portal/").get_data(as_text=True)
    assert "acme &lt;b&gt;&amp;&lt;/b&gt;" in page and "<b>&</b>" not in page


@pytest.mark.parametrize("accent, text, links", [("#0B5FFF", "#fff", True), ("#ffe066", "#1d2330", False),
                                                 ("#7a1f5c", "#fff", True), ("#3b82f6", "#1d2330", False)])
def test_the_accent_colour_is_a_stylesheet_with_a_readable_text_colour(app, producer, consumer, accent, text, links):
    allow(producer, accent_color=accent)
    browser = app.test_client()
    open_portal(browser, producer, "cus_1")
    css = browser.get("/portal/theme.css")
    assert css.mimetype == "text/css"
    body = css.get_data(as_text=True)
    assert f"--accent: {accent.lower()};" in body and f"--accent-text: {text};" in body
    # Links take the accent only where it reads on the page's white (4.5:1); a light one leaves them blue.
    assert (f"--accent-link: {accent.lower()};" in body) is links
    assert 'href="/portal/theme.css"' in browser.get("/portal/").get_data(as_text=True)


def test_without_an_accent_the_stylesheet_is_empty_and_the_dashboard_never_loads_it(app, producer, consumer, users,
                                                                                   auth, client):
    browser = app.test_client()
    open_portal(browser, producer, "cus_1")
    assert browser.get("/portal/theme.css").get_data(as_text=True) == ""
    auth.login("owner")
    assert "theme.css" not in client.get("/").get_data(as_text=True)
