"""The consumer portal inside the producer's product, in a real browser: the team's owner names the producer's
origin on the Consumers page, and a page of that origin (a second loopback server, another port) shows a portal
link in an <iframe>: the portal's home loads inside it, in the team's colours, with its logo and name fitting.
Once the origin is no longer allowed, the browser refuses to show the portal in that frame.

Over plain http the portal's cookie is SameSite=Lax; two ports of 127.0.0.1 are one site, so it is sent in the
frame. Across sites, over https, it is SameSite=None; Secure; Partitioned (tests/portal/test_portal_links.py)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.browser import DESKTOP, PHONE, assert_fits, assert_on_screen, sign_in
from tests.support.portal import link_path
from tests.web.test_browser import assert_no_csp_violations, browser_page, live_url  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]
LONG_TEAM = "Globalsubsidiaryholdingsincorporated" * 3  # no place to break: the top bar must still fit a phone
LOGO = "https://logo.example.com/brand/logo.svg"
WIDE_SVG = ('<svg xmlns="http://www.w3.org/2000/svg" width="600" height="100">'
            '<rect width="600" height="100" fill="#ffcc00"/></svg>')
ACCENT, ACCENT_RGB = "#7a1f5c", "rgb(122, 31, 92)"
PORTAL_HOME = "Your webhook endpoints"


@pytest.fixture
def producer_site():
    """The producer's own product on another port: GET /?src=<url> is a page with that url in an iframe."""
    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            from urllib.parse import parse_qs, urlsplit

            src = parse_qs(urlsplit(self.path).query).get("src", [""])[0]
            body = (f'<!doctype html><title>Producer</title><h1>Your account</h1>'
                    f'<iframe id="portal" title="Webhooks" src="{src}" width="100%" height="600" '
                    f'onload="this.dataset.loaded = (this.dataset.loaded || 0) + 1"></iframe>').encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def portal_frame(page):
    """The iframe's frame once it has finished loading (its portal page, or the browser's refusal)."""
    page.wait_for_function("() => document.getElementById('portal').dataset.loaded")
    [frame] = [f for f in page.frames if f != page.main_frame]
    return frame


def save_settings(page, live_url, team_id, origins: str):
    page.goto(f"{live_url}/consumers?team={team_id}")
    page.fill("textarea[name=frame_ancestors]", origins)
    page.fill("input[name=accent_color]", ACCENT)
    page.fill("input[name=logo_url]", LOGO)
    page.click("button:text('Save portal settings')")
    assert page.locator(".flash").inner_text().startswith("Portal settings")  # saved, or nothing changed


def test_the_portal_shows_in_the_producers_iframe_only_from_an_allowed_origin(app, producer, users, live_url,
                                                                               producer_site, browser_page):
    from dashboard.core.extensions import db

    producer.team.name = LONG_TEAM
    db.session.commit()
    producer.put_consumer("cus_1", name="Initech")
    sub = producer.subscribe("https://hooks.initech.example/in", consumer="cus_1", description="orders")
    page = browser_page
    page.route(LOGO, lambda route: route.fulfill(body=WIDE_SVG, content_type="image/svg+xml"))

    # The team's owner allows the producer's origin, on the Consumers page (the form fits a phone too).
    sign_in(page, live_url, "owner")
    for viewport in (DESKTOP, PHONE):
        page.set_viewport_size(viewport)
        save_settings(page, live_url, producer.team.id, producer_site + "\n")
        assert page.input_value("textarea[name=frame_ancestors]") == producer_site
        assert page.input_value("input[type=color]") == ACCENT
        assert_on_screen(page.locator("button:text('Save portal settings')"))
        assert_fits(page)
    dashboard_top = page.evaluate("getComputedStyle(document.querySelector('.top')).backgroundColor")
    assert dashboard_top == "rgb(29, 35, 48)"  # the dashboard keeps its own colours

    # The producer's page frames a portal link: the link signs the frame in, and the portal's home shows there.
    page.set_viewport_size(DESKTOP)
    page.goto(f"{producer_site}/?src={live_url}{link_path(producer, 'cus_1')}")
    frame = portal_frame(page)
    assert frame.url == f"{live_url}/portal/"
    assert PORTAL_HOME in frame.locator("h1").inner_text()
    assert frame.locator("text=orders").count() >= 1
    top = frame.locator(".portal-top")
    assert top.evaluate("el => getComputedStyle(el).backgroundColor") == ACCENT_RGB
    assert frame.locator(".portal-top .brand").inner_text().strip() == LONG_TEAM
    assert frame.locator(".portal-logo").evaluate("img => img.complete && img.naturalWidth") == 600
    assert_no_csp_violations(page)

    # The portal on its own, at both widths: the accent on its links, a wide logo and a long name in the bar.
    for viewport in (DESKTOP, PHONE):
        page.set_viewport_size(viewport)
        for path in ("/portal/", f"/portal/subscriptions/{sub['id']}"):
            assert page.goto(live_url + path).ok
            assert page.locator(".portal-top").evaluate("el => getComputedStyle(el).backgroundColor") == ACCENT_RGB
            assert page.locator(".portal-logo").evaluate("img => img.naturalWidth") == 600
            assert_on_screen(page.locator(".portal-logo"))
            assert_on_screen(page.locator(".portal-top .brand"))
            assert_on_screen(page.locator(".portal-top nav a").first)  # no Menu button in the portal: never hidden
            assert_fits(page)
        link = page.locator("main a:not(.button)").first
        assert link.evaluate("a => getComputedStyle(a).color") == ACCENT_RGB
    assert_no_csp_violations(page)

    # The origin is no longer allowed (another port of the same host is): the browser refuses the frame.
    page.set_viewport_size(DESKTOP)
    save_settings(page, live_url, producer.team.id, "http://127.0.0.1:1")
    page.goto(f"{producer_site}/?src={live_url}{link_path(producer, 'cus_1')}")
    frame = portal_frame(page)
    assert frame.url == "chrome-error://chromewebdata/" or frame.locator(f"text={PORTAL_HOME}").count() == 0
