"""The consumers list and a consumer's page in a real browser, at a desktop's width and a phone's: nothing wider
than the screen, the consumer's state, its disable button and its "replay since" form on screen, and disabling it
from the page."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import Consumer, Team

from tests.support.browser import DESKTOP, PHONE, assert_fits, assert_on_screen, sign_in
from tests.web.test_browser import browser_page, deliver_due, live_url  # noqa: F401 (fixtures and a helper)

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]
# A uid and a name with no place to break: the list's cell and the consumer's heading must still fit a phone.
LONG_UID = "org:" + "tenant-" * 13 + "x"
LONG_NAME = "Initech " + "<b>" + "Globalsubsidiaryholdings" * 3 + "</b>"


def test_an_owner_reads_its_consumers_and_disables_one_at_both_widths(app, producer, receiver, clock, users,
                                                                       live_url, browser_page):
    producer.put_consumer(LONG_UID, name=LONG_NAME)
    producer.put_consumer("cus_2", name="Umbrella")
    failing = producer.subscribe(receiver.url + "/status/400/" + "billing-webhook-receiver-" * 3, consumer=LONG_UID)
    producer.subscribe(receiver.url + "/ok", consumer=LONG_UID)
    for _ in range(3):
        resp = producer.post("/api/v1/events", {"type": "file.updated", "data": {"resource_id": "f_1"},
                                                "consumer": LONG_UID})
        assert resp.status_code == 202
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(hours=1)
    team = db.session.scalar(select(Team.id).where(Team.name == "acme"))
    page = browser_page
    sign_in(page, live_url, "owner")

    for viewport in (DESKTOP, PHONE):
        page.set_viewport_size(viewport)
        page.goto(live_url + "/consumers")
        row = page.locator("table.consumers tbody tr", has_text=LONG_NAME)  # the producer's text, shown as text
        assert "1 of 2 failing or stopped" in row.inner_text()
        assert_on_screen(row.locator("td[data-label='Health']"))
        assert_on_screen(row.locator("td[data-label='Dead letters'] a.bad"))
        assert_fits(page)

        page.goto(f"{live_url}/consumers/{team}/{LONG_UID}")
        assert_on_screen(page.locator("main h1"))
        assert_on_screen(page.locator("button:text('Disable')"))
        assert_on_screen(page.locator(f"table.overview a[href='/subscriptions/{failing['id']}']"))
        assert page.locator("text=3 dead letters").count() == 1
        assert_on_screen(page.locator("#replay-since select[name=subscription]"))  # its endpoints, long URLs too
        assert_on_screen(page.locator("#replay-since input[name=since]"))
        assert_on_screen(page.locator("#replay-since button:text('Replay since')"))
        assert_fits(page)

    page.select_option("#replay-since select[name=subscription]", failing["id"])
    page.fill("#replay-since input[name=since]", "2000-01-01T00:00")
    page.locator("#recover-preview", has_text="Now: 3 events since 2000-01-01 00:00:00 UTC").wait_for()  # its dead
    assert_fits(page)

    page.fill("input[name=reason]", "moving datacentres")
    page.click("button:text('Disable')")
    page.wait_for_url(f"{live_url}/consumers/{team}/{LONG_UID}")
    assert "Disabled: " in page.locator("p.flash").inner_text()
    assert_on_screen(page.locator("text=Disabled: moving datacentres."))
    assert_fits(page)
    assert page.dialogs and "Disable consumer" in page.dialogs[-1]
    db.session.expire_all()
    assert db.session.scalar(select(Consumer.state).where(Consumer.uid == LONG_UID)) == "disabled"
