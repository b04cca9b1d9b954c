"""The operator's desk in a real browser (Debian's headless Chromium, Playwright): an on-call engineer
reads without buttons and is refused a forged POST; an owner creates and revokes a token.
Each test saves screenshots of the pages it walks through under test-output/screenshots/ (git-ignored)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import Delivery

from tests.web.test_browser import browser_page, deliver_due, live_url  # noqa: F401 (fixtures and a helper)

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"


def shoot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def sign_in(page, live_url, role):
    page.goto(live_url + "/login")
    page.fill("input[name=email]", f"{role}@example.com")
    page.fill("input[name=password]", "pw-" + role)
    page.click("button[type=submit]")
    page.wait_for_url(live_url + "/")


def test_oncall_reads_every_page_without_buttons_and_a_forged_post_is_refused(
        app, producer, receiver, clock, users, live_url, browser_page):
    sub = producer.subscribe(receiver.url + "/status/503", description="billing")
    producer.subscribe(receiver.url + "/status/200", description="search")
    event = producer.publish(data={"resource_id": "f_7"})
    deliver_due(app, clock)
    clock.advance(minutes=2)
    producer.post(f"/api/v1/subscriptions/{sub['id']}/pause")
    delivery_id = db.session.scalar(select(Delivery.id).where(Delivery.subscription_id == sub["id"]))
    page = browser_page

    sign_in(page, live_url, "oncall")
    rows = page.locator("table.overview tbody tr")
    assert "billing" in rows.first.inner_text()  # the failing one first
    from playwright.sync_api import expect

    expect(page.locator("svg.sparkline")).to_have_count(2)  # the second row, once parsed
    shoot(page, "overview")

    rows.first.locator("a").first.click()
    page.wait_for_url(f"{live_url}/subscriptions/{sub['id']}")  # counting does not wait for the page
    assert page.locator("svg.bars:visible").count() == 1  # the wide chart; its phone copy is hidden
    assert page.locator("main button").count() == 1  # only the delivery filter's "Filter"; no actions
    assert page.locator("main form[method=post]").count() == 0
    assert "subscription.paused" in page.locator("table.audit").inner_text()
    shoot(page, "subscription")

    token = json.loads(page.get_attribute("body", "hx-headers"))["X-CSRFToken"]
    forged = page.request.post(f"{live_url}/subscriptions/{sub['id']}/resume", form={"csrf_token": token})
    assert forged.status == 403

    page.goto(f"{live_url}/events?q=f_7")
    page.click(f"text={event['id']}")
    page.wait_for_url(f"{live_url}/events/{event['id']}?team=*")
    assert page.locator("section.delivery-summary").count() == 2
    shoot(page, "event")
    page.goto(f"{live_url}/deliveries/{delivery_id}")
    assert "v1=" in page.locator("table.headers").inner_text() and "…" in page.locator("table.headers").inner_text()
    shoot(page, "delivery")
    page.click("nav >> text=Audit log")
    page.wait_for_url(f"{live_url}/audit")
    assert page.locator("table.audit tbody tr").count() >= 3
    shoot(page, "audit")


def _api_status(live_url, token):
    request = urllib.request.Request(live_url + "/api/v1/events", data=b'{"type": "a.b"}', method="POST",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_an_owner_creates_and_revokes_a_token(app, producer, users, live_url, browser_page):
    page = browser_page
    sign_in(page, live_url, "owner")
    page.click("nav >> text=Tokens")
    page.click("text=Create a token")
    secret = page.locator("#one-time-secret").inner_text().strip()
    assert secret.startswith("pk_") and _api_status(live_url, secret) == 202
    shoot(page, "tokens")

    page.goto(live_url + "/tokens")
    assert secret not in page.content()  # shown once
    row = page.locator("tr", has_text=secret[:10])
    row.locator("text=Revoke").click()
    assert page.dialogs[-1].startswith("Revoke token pk_")
    assert "revoked" in page.locator("tr", has_text=secret[:10]).inner_text()
    assert _api_status(live_url, secret) == 401

    page.click("text=Sign out")
    sign_in(page, live_url, "admin")
    page.click("nav >> text=Users")
    page.fill("form[aria-label='Create a user'] input[name=email]", "new-oncall@example.com")
    page.select_option("form[aria-label='Create a user'] select[name=role]", "oncall")
    page.click("text=Create user")
    assert page.locator("#one-time-secret").inner_text().strip()
    shoot(page, "users")
