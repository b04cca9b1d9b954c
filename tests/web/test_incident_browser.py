"""The on-call page in a real browser, under the strict Content-Security-Policy the dashboard will
send: on-call follows the link, acknowledges, snoozes and ends the snooze, an operator replays from it; the
page and the list fit a desktop and a phone. Screenshots go to test-output/screenshots/ (git-ignored)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import Incident
from dashboard.operations.sweeper import sweep_once

from tests.support.browser import DESKTOP, PHONE, assert_fits, sign_in
from tests.web.test_browser import browser_page, deliver_due, live_url  # noqa: F401 - shared fixtures

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "frame-ancestors 'none'")


def test_oncall_acknowledges_and_an_operator_replays_in_the_browser(app, producer, receiver, clock, users,
                                                                   live_url, browser_page):  # noqa: F811
    @app.after_request
    def strict_csp(resp):
        resp.headers["Content-Security-Policy"] = CSP
        return resp

    producer.subscribe(receiver.url + "/status/400", description="billing <hook>")
    for _ in range(6):
        producer.publish()
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(minutes=2)
    sweep_once(app)
    incident = db.session.scalar(select(Incident))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = browser_page

    sign_in(page, live_url, "oncall")
    assert page.locator("header .badge").inner_text() == "1 open incident"
    page.click("header .badge")
    page.click("text=Dead letters piling up")
    assert page.url == f"{live_url}/incidents/{incident.id}"
    assert page.locator("#incident-state").inner_text() == "open"
    page.wait_for_load_state("load")  # the whole page parsed and its stylesheet applied
    assert page.locator("figure.chart svg rect.dead").count() > 0
    # Drawn by classes from the stylesheet: under the CSP, the dead-letter bars are red.
    fill = page.evaluate("getComputedStyle(document.querySelector('figure.chart rect.dead')).fill")
    assert fill == "rgb(220, 38, 38)"
    assert page.locator("text=status 400 from /status/400").count() == 1
    page.screenshot(path=str(SCREENSHOTS / "incident-open-oncall.png"), full_page=True)
    page.click("button:text('Acknowledge')")
    assert page.locator("#incident-state").inner_text() == "acknowledged"
    assert "No notification sink is configured, so none will be told" in page.locator(".flash").inner_text()
    assert page.locator("button:text('Replay these')").count() == 0  # on-call acknowledges, nothing more
    page.click("button:text-is('Snooze')")
    assert page.locator(".flash").inner_text().startswith("Snoozed until")
    for size in (DESKTOP, PHONE):  # snoozed: its longest form
        page.set_viewport_size(size)
        for path in (f"/incidents/{incident.id}", "/incidents"):
            page.goto(live_url + path)
            assert_fits(page)
    page.set_viewport_size(DESKTOP)
    page.goto(f"{live_url}/incidents/{incident.id}")
    page.click("button:text('End snooze')")
    assert page.locator(".flash").inner_text() == "Snooze ended: notifications about it resume now."
    assert page.locator("#incident-snoozed").count() == 0
    page.click("text=Sign out")

    sign_in(page, live_url, "operator")
    page.goto(f"{live_url}/incidents/{incident.id}")
    page.click("button:text('Replay these')")
    assert "Replaying 6 dead letters" in page.locator(".flash").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "incident-replayed-operator.png"), full_page=True)
    page.goto(f"{live_url}/incidents")
    page.screenshot(path=str(SCREENSHOTS / "incidents-list.png"), full_page=True)
