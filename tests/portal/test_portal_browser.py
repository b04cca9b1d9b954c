"""The consumer portal end to end, in a real browser, through a real link: a consumer opens the link its producer
handed it, registers its endpoint (a real receiver on 127.0.0.1) and copies the secret, receives an event addressed
to it and verifies it with that secret, sees its receiver's 500s turn into dead letters, replays them after the fix
as a job with progress, rotates the secret and runs the receiver check. Every page it opens fits a 400 px phone."""

from __future__ import annotations

import json

import pytest
from promesa_receiver import consumer_of, verify
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import Delivery, Subscription

from tests.support.browser import DESKTOP, PHONE, assert_fits, assert_on_screen
from tests.support.portal import link_path
from tests.support.switchable import SwitchableReceiver
from tests.web.test_browser import assert_no_csp_violations, browser_page, deliver_due, live_url  # noqa: F401
from tests.web.test_browser_replays import start_worker

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


@pytest.fixture
def switchable():
    with SwitchableReceiver(status=200) as r:
        yield r


def _fits_at_both_widths(page) -> None:
    for size in (PHONE, DESKTOP):
        page.set_viewport_size(size)
        assert_on_screen(page.locator("main h1"))
        assert_fits(page)


def _publish(producer, uid: str, resource_id: str) -> None:
    resp = producer.post("/api/v1/events", {"type": "invoice.paid", "data": {"resource_id": resource_id},
                                            "consumer": uid})
    assert resp.status_code == 202, resp.get_json()


def _dead(sub_id: str) -> list[Delivery]:
    db.session.expire_all()
    return db.session.scalars(select(Delivery).where(Delivery.subscription_id == sub_id,
                                                     Delivery.state == "dead")).all()


def test_a_consumer_registers_receives_repairs_rotates_and_checks_through_its_portal(
        app, producer, clock, switchable, live_url, browser_page):  # noqa: F811
    from playwright.sync_api import expect

    app.config["PROMESA_DRAIN_LINGER_SECONDS"] = 0.0
    producer.put_consumer("cus_initech", name="Initech")
    producer.put_consumer("cus_globex", name="Globex")  # the neighbour: never named in Initech's portal
    page = browser_page
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_url)
    page.set_viewport_size(DESKTOP)

    # The link signs this browser in, once.
    link = link_path(producer, "cus_initech", expires_in=7 * 86400)  # the repair below spans two days
    page.goto(live_url + link)
    page.wait_for_url(f"{live_url}/portal/")
    assert "No endpoint yet" in page.locator("main").inner_text()
    _fits_at_both_widths(page)

    # Register the endpoint; the secret is shown once, and copied.
    page.click("nav >> text=New endpoint")
    page.fill("input[name=url]", switchable.url + "/webhooks")
    page.click("button:text('Create endpoint')")
    page.wait_for_url("**/portal/subscriptions/*/created")
    _fits_at_both_widths(page)
    page.click("button[data-copy=new-secret]")
    expect(page.locator("button[data-copy=new-secret]")).to_have_text("Copied")
    secret = page.evaluate("navigator.clipboard.readText()")
    sub = db.session.scalar(select(Subscription).where(Subscription.consumer_id.is_not(None)))
    assert sub.url == switchable.url + "/webhooks"

    # An event addressed to it arrives, signed with the secret it copied; the neighbour's does not.
    _publish(producer, "cus_initech", "in_1")
    _publish(producer, "cus_globex", "in_2")
    deliver_due(app, clock)
    [got] = switchable.accepted()
    assert consumer_of(got.headers) == "cus_initech"
    verify(got.body, got.headers.get("X-Signature"), secret, now=clock.now().timestamp())  # raises if forged
    assert json.loads(got.body)["data"]["resource_id"] == "in_1"

    # Its receiver breaks: the failures show, then dead letters.
    switchable.status = 500
    for n in range(3):
        _publish(producer, "cus_initech", f"in_{10 + n}")
    for _ in range(40):
        deliver_due(app, clock)
        if len(_dead(sub.id)) == 3:
            break
        clock.advance(hours=6)
    assert len(_dead(sub.id)) == 3
    page.goto(f"{live_url}/portal/")
    assert "3 dead letters" in page.locator("main").inner_text()
    assert "last error: HTTP 500 (server error)" in page.locator("table.overview").inner_text()  # health, in words
    page.click(f"table.overview a[href='/portal/subscriptions/{sub.id}']")
    page.click("nav.filters >> text=dead")
    rows = page.locator("table.cards:has(th:text-is('Next attempt (UTC)')) tbody tr")  # the deliveries
    expect(rows).to_have_count(3)
    assert "500" in rows.first.inner_text()
    _fits_at_both_widths(page)
    diagnosis = page.locator("#diagnosis").inner_text()  # the failures grouped by cause, with advice
    assert "500" in diagnosis
    rows.first.locator("a").first.click()  # one delivery: its attempts, each with the status and the answer
    page.wait_for_url("**/portal/deliveries/*")
    assert "500" in page.locator("main").inner_text()
    _fits_at_both_widths(page)

    # Fixed: replay every dead letter, as a job whose progress the page follows.
    switchable.status = 200
    page.goto(f"{live_url}/portal/subscriptions/{sub.id}")
    page.click("button:text('Replay all dead letters')")
    page.wait_for_url("**/portal/replays/*")
    worker = start_worker(app)
    page.wait_for_selector(".replay-succeeded:text-is('3')", timeout=30_000)
    worker.join(timeout=60)
    _fits_at_both_widths(page)
    assert sorted(json.loads(r.body)["data"]["resource_id"] for r in switchable.accepted()[1:]) == \
        ["in_10", "in_11", "in_12"]

    # Rotate the secret: the new one is shown once, in place.
    page.goto(f"{live_url}/portal/subscriptions/{sub.id}")
    page.click("button:text('Rotate secret')")
    expect(page.locator("#new-secret")).to_be_visible()
    assert page.locator("#new-secret").inner_text().strip() != secret
    _fits_at_both_widths(page)

    # The receiver check, and its report card, which polls itself until the job is done.
    page.goto(f"{live_url}/portal/subscriptions/{sub.id}")
    page.click("button:text('Run receiver check')")
    worker = start_worker(app)
    page.wait_for_selector("#receiver-check tr[data-rule=forged_rejected]", timeout=30_000)
    worker.join(timeout=60)
    card = page.locator("#receiver-check").inner_text()
    assert "passed" in card and "failed" in card  # this receiver accepts forged requests: the card says so
    _fits_at_both_widths(page)

    # Nothing of the team's other consumer, nor of any user, anywhere the consumer looked.
    assert "Globex" not in page.content() and "@example.com" not in page.content()
    assert_no_csp_violations(page)

    # The contract with its verification snippets, and the edit form, fit a phone too.
    for path in ("contract", "edit"):
        page.goto(f"{live_url}/portal/subscriptions/{sub.id}/{path}")
        _fits_at_both_widths(page)

    # The link worked once.
    page.context.clear_cookies()
    page.goto(live_url + link)
    assert "used already" in page.locator("main").inner_text()
