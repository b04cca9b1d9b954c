"""An outage, as the operator lives it, in a real browser (Debian's headless Chromium via Playwright): they
find the failing endpoint, read why and since when on its page, pause it with a reason, replay its dead
letters while it is paused and are told they are held, resume it, and see everything delivered."""

from __future__ import annotations

import pytest

from tests.support.switchable import SwitchableReceiver
from tests.web.test_browser import assert_no_csp_violations, browser_page, deliver_due, live_url  # noqa: F401
from tests.web.test_browser_replays import sign_in

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


@pytest.fixture
def endpoint():
    with SwitchableReceiver(status=400) as receiver:
        yield receiver


def test_an_operator_rides_out_an_outage(app, producer, endpoint, clock, users, live_url, browser_page):  # noqa: F811
    sub = producer.subscribe(endpoint.url + "/hooks/billing")
    for _ in range(2):  # refused three times each: two dead letters
        producer.publish("invoice.paid")
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(minutes=20)
    endpoint.status = 503  # and now the receiver is down
    producer.publish("invoice.paid")
    deliver_due(app, clock)
    clock.advance(minutes=2)
    page = browser_page
    dialogs = page.dialogs  # accepted by the fixture

    sign_in(page, live_url, "operator")
    row = page.locator("#subscriptions tr", has_text=endpoint.url)
    row.locator("a", has_text=endpoint.url).click()

    state = page.locator("#current-state")
    assert "HTTP 503 (server error)" in state.locator(".last-error").inner_text()
    assert "status 503 from /hooks/billing" in state.locator(".last-error pre").inner_text()  # the receiver's words
    assert "ago" in state.locator(".failing-since").inner_text()
    assert "1 scheduled" in state.locator(".next-retry").inner_text()
    page.wait_for_load_state("load")  # the stylesheet applied, so labels are measured in their font
    # Time labels stay inside their chart, and a failure is the same colour here as on the overview.
    clipped = page.evaluate("""() => [...document.querySelectorAll('svg.chart text.tick')].filter(t => {
        const box = t.getBBox(), width = t.ownerSVGElement.width.baseVal.value;
        return box.x < 0 || box.x + box.width > width; }).map(t => t.textContent)""")
    assert clipped == []
    for name, window in (("1h", "last hour, per minute"), ("7d", "last 7 days, per hour")):
        page.click(f"nav[aria-label='Chart window'] >> text={window}")
        page.wait_for_url(f"**window={name}*")  # the new window's page, loaded, not the last one
        assert page.evaluate("""() => [...document.querySelectorAll('svg.chart text.tick')].every(t => {
            const box = t.getBBox(); return box.x >= 0 && box.x + box.width <= t.ownerSVGElement.width.baseVal.value; })""")
    here = page.evaluate("getComputedStyle(document.querySelector('svg.chart.bars path.fail')).fill")

    page.fill("form.pause input[name=reason]", "billing vendor outage <INC-7>")
    page.click("form.pause button")
    assert "Paused by operator@example.com" in state.inner_text()
    assert "billing vendor outage <INC-7>" in state.locator(".reason").inner_text()
    assert "1 delivery is held until you resume it" in state.inner_text()
    audit = page.locator("table.audit").inner_text()
    assert "subscription.paused" in audit and "reason: billing vendor outage <INC-7>" in audit

    page.click("button:text('Replay all dead letters')")
    assert dialogs[-1] == ("Replay all 2 dead letters of this subscription? They will be held until you resume it."
                                   " Careful: its last attempt failed 2 min ago with HTTP 503 (server error): these will"
                                   " likely fail again and return to the dead letters.")
    flash = page.locator(".flash").inner_text()
    assert "Replaying 2 dead deliveries" in flash and "they are held until you resume it" in flash
    deliver_due(app, clock)
    assert endpoint.accepted() == []  # nothing is sent while paused
    assert "3 deliveries are held until you resume it" in state.inner_text()

    endpoint.status = 200  # the vendor is back
    page.click("#current-state button:text('Resume and send the 3 held')")
    assert "Resumed: 3 held deliveries are on their way" in page.locator(".flash").inner_text()
    deliver_due(app, clock)
    assert len(endpoint.accepted()) == 3
    page.goto(live_url + f"/subscriptions/{sub['id']}?state=succeeded")
    assert page.locator("td .state", has_text="succeeded").count() == 3
    assert "Delivering" in page.locator("#current-state").inner_text()

    page.goto(live_url + "/")
    assert page.evaluate("getComputedStyle(document.querySelector('svg.sparkline path.fail')).fill") == here
    assert_no_csp_violations(page)


def test_the_confirmation_can_say_no(app, producer, endpoint, clock, users, live_url, browser_page):  # noqa: F811
    sub = producer.subscribe(endpoint.url + "/hooks/billing")
    producer.publish()
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(minutes=20)
    page = browser_page
    asked = []

    def refuse(dialog):
        asked.append(dialog.message)
        dialog.dismiss()

    page.remove_listener("dialog", page.accept_dialogs)
    page.on("dialog", refuse)
    sign_in(page, live_url, "operator")
    page.goto(live_url + f"/subscriptions/{sub['id']}")
    page.click("button:text('Discard all dead letters')")
    assert asked == ["Discard all 1 dead letters of this subscription? They will never be sent; they stay readable."]
    assert page.url.endswith(f"/subscriptions/{sub['id']}")  # nothing was posted
    page.goto(live_url + "/dead-letters")
    page.click("button:text('Discard selected')")  # none ticked: refused at once, nothing asked
    assert asked[-1] == "Select some first."
    page.check(f"input[name=delivery_id]")
    page.click("button:text('Replay selected')")
    assert asked[-1] == "Replay the 1 selected dead letters?"
    assert "/dead-letters" in page.url
    assert_no_csp_violations(page)
