"""The overview during an outage and the recent events, in a real browser (Debian's headless Chromium,
Playwright), at a desktop's width and a phone's: what needs a person comes first, with its incident."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import Incident

from tests.support.browser import DESKTOP, PHONE, assert_fits, assert_on_screen, sign_in
from tests.web.test_browser import browser_page, deliver_due, live_url  # noqa: F401 (fixtures and a helper)
from tests.web.test_overview import outage_with_an_incident

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


def test_the_overview_puts_the_incident_first_and_the_events_page_lists_the_recent_ones(
        app, client, auth, producer, receiver, clock, users, live_url, browser_page):
    failing, given_up = outage_with_an_incident(app, client, auth, producer, receiver, clock, deliver=deliver_due)
    incident = db.session.scalar(select(Incident).where(Incident.subscription_id == given_up["id"]))
    newest = producer.publish("c.happened")
    page = browser_page
    sign_in(page, live_url, "oncall")

    for viewport in (DESKTOP, PHONE):
        page.set_viewport_size(viewport)
        page.goto(live_url + "/")
        first, second = (page.locator("tr", has=page.locator(f'a[href="/subscriptions/{sub["id"]}"]'))
                         for sub in (given_up, failing))
        assert first.bounding_box()["y"] < second.bounding_box()["y"]  # dead letters and an incident, first
        link = first.locator(f'a[href="/incidents/{incident.id}"]')
        assert "open incident" in link.inner_text()
        assert_on_screen(link)
        assert "of events delivered" in first.inner_text() and "of attempts succeeded" in second.inner_text()
        assert_fits(page)

        page.goto(live_url + "/events")
        assert page.locator("input[type=search]").count() == 1
        rows = page.locator("main tbody tr")
        assert rows.count() == 32  # 10 + 21 + 1 events
        assert_on_screen(rows.first.locator(f'a[href="/events/{newest["id"]}?team=acme"]'))  # newest first
        assert_fits(page)

    page.go_back()
    link.click()
    page.wait_for_url(f"{live_url}/incidents/{incident.id}")
