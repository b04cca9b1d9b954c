"""On-call, owner and admin in a real browser (Debian's headless Chromium, as tests/web/test_browser.py):
on-call reads and acknowledges an incident on a 400 px phone; an owner creates an endpoint in the form,
rotates and copies its secret (readable: contrast at least 4.5:1), edits it and finds the change in the
audit log, and makes a named token; an admin adds a named, filtered sink and sends it a test message."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import select

from dashboard.core import crypto
from dashboard.core.extensions import db
from dashboard.models import NotificationSink, Subscription

from tests.web.test_browser import assert_no_csp_violations, browser_page, deliver_due, live_url  # noqa: F401
from tests.web.test_incident_pages import fired  # noqa: F401  (one open dead_letters incident, 5 dead letters)

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"

# WCAG's contrast ratio of an element's text colour against its background colour, as the browser computed them.
CONTRAST = """el => {
  const rgb = s => s.match(/[\\d.]+/g).slice(0, 3).map(Number);
  const lum = c => { const [r, g, b] = c.map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
                     return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const style = getComputedStyle(el);
  const [a, b] = [lum(rgb(style.color)), lum(rgb(style.backgroundColor))].sort((x, y) => y - x);
  return (a + 0.05) / (b + 0.05);
}"""


def _sign_in(page, live_url, role, then=None):  # noqa: F811
    page.goto(live_url + (then or "/login"))
    page.fill("input[name=email]", f"{role}@example.com")
    page.fill("input[name=password]", f"pw-{role}")
    page.click("button[type=submit]")


def _read_and_copy(page, secret_id: str) -> str:
    """The one-time secret as shown: readable, and what the Copy button puts on the clipboard."""
    shown = page.locator(f"#{secret_id}")
    assert shown.evaluate(CONTRAST) >= 4.5
    page.click(f"button[data-copy={secret_id}]")
    from playwright.sync_api import expect

    expect(page.locator(f"button[data-copy={secret_id}]")).to_have_text("Copied")  # the clipboard answers later
    assert page.evaluate("navigator.clipboard.readText()") == shown.inner_text().strip()
    return shown.inner_text().strip()


def test_oncall_reads_and_acknowledges_an_incident_on_a_phone(fired, live_url, browser_page):  # noqa: F811
    _, incident = fired
    page = browser_page
    page.set_viewport_size({"width": 400, "height": 860})

    _sign_in(page, live_url, "oncall", then=f"/incidents/{incident.id}")  # the link from the alert
    assert page.url.endswith(f"/incidents/{incident.id}")
    page.wait_for_load_state("load")  # the stylesheet applied
    assert page.evaluate("document.documentElement.scrollWidth") <= 400  # nothing cut off or wider than the phone
    assert not page.locator("#main-nav").is_visible()  # the nav collapses behind a Menu button
    page.click("button.nav-toggle")
    assert page.locator("#main-nav").is_visible()
    page.click("button.nav-toggle")
    figures = page.locator("#incident-figures").inner_text()
    assert "5 dead-lettered in the 15-minute window, 5 still dead" in figures
    assert page.locator("header .badge").inner_text() == "1 open incident"
    for table in page.locator("main table").all():  # tables scroll inside their box, never the page
        assert table.evaluate("t => t.getBoundingClientRect().right") <= 400
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "incident-on-a-phone.png"), full_page=True)

    page.fill("input[name=note]", "restarting the billing receiver")
    page.click("button:text('Acknowledge')")
    assert page.locator("#incident-state").inner_text() == "acknowledged"
    assert "restarting the billing receiver" in page.locator("#incident-acknowledged").inner_text()
    assert page.locator("header .badge").count() == 0  # acknowledged: the badge counts only the unacknowledged
    assert_no_csp_violations(page)


def test_an_owner_creates_rotates_copies_edits_and_makes_a_token(app, producer, receiver, clock, users, live_url,
                                                                 browser_page):  # noqa: F811
    assert producer.post("/api/v1/event-types", {"name": "invoice.paid", "version": 1,
                                                 "schema": {"type": "object"}}).status_code in (200, 201)
    page = browser_page
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_url)
    _sign_in(page, live_url, "owner")

    page.click("nav >> text=New subscription")
    page.fill("input[name=url]", receiver.url + "/first")
    page.uncheck("input[name=event_types][value='*']")
    page.check("input[name=event_types][value='invoice.paid']")
    page.fill("input[name=event_patterns]", "file.*")
    page.click("button:text('Create subscription')")
    created = _read_and_copy(page, "new-secret")
    db.session.expire_all()
    sub = db.session.scalar(select(Subscription).where(Subscription.url == receiver.url + "/first"))
    assert sub.event_types == ["invoice.paid", "file.*"] and crypto.decrypt(sub.secret_ciphertext) == created

    page.click("text=Open the subscription")
    page.select_option("select[name=grace_seconds]", "3600")
    page.click("button:text('Rotate secret')")
    rotated = _read_and_copy(page, "new-secret")
    assert rotated != created
    assert "the previous one until" in page.locator(".owner-tools .signing").inner_text()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "owner-copies-a-rotated-secret.png"), full_page=True)

    page.click("a:text('Edit')")
    assert page.locator("input[name=event_types][value='invoice.paid']").is_checked()  # chosen as on creation
    page.fill("input[name=url]", receiver.url + "/second")
    page.click("button:text('Save')")
    page.click("nav >> text=Audit log")
    change = page.locator("table.audit tr", has_text="subscription.edited").locator(".diff")
    assert change.locator("del").inner_text() == receiver.url + "/first"
    assert change.locator("ins").inner_text() == receiver.url + "/second"
    assert created not in page.content() and rotated not in page.content()

    page.click("nav >> text=Tokens")
    page.fill("input[name=name]", "billing producer")
    page.select_option("select[name=expires_in_days]", "90")
    page.click("button:text('Create a token')")
    token = _read_and_copy(page, "one-time-secret")
    row = page.locator("table.tokens tr[data-name='billing producer']")
    assert row.locator(".last-used").inner_text() == "never"
    request = urllib.request.Request(live_url + "/api/v1/subscriptions", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request) as answer:
        assert answer.status == 200 and json.load(answer)["data"]
    page.goto(live_url + "/tokens")  # not a reload: that would post the form again
    assert row.locator(".last-used").inner_text() == clock.now().strftime("%Y-%m-%d %H:%M")
    assert "by owner@example.com" in row.inner_text()
    assert_no_csp_violations(page)


def test_an_admin_adds_a_named_filtered_sink_and_sends_it_a_test_message(app, receiver, clock, users, live_url,
                                                                         browser_page):  # noqa: F811
    page = browser_page
    _sign_in(page, live_url, "admin")
    page.click("nav >> text=Notification sinks")
    page.fill("#add-sink input[name=name]", "#acme-oncall")
    page.select_option("#add-sink select[name=kind]", "json")
    page.fill("#add-sink input[name=url]", receiver.url + "/ok")
    page.check("#add-sink input[name=teams][value=acme]")
    page.check("#add-sink input[name=kinds][value='incident.opened']")
    page.click("#add-sink button:text('Add')")
    assert page.locator("#sink-secret").evaluate(CONTRAST) >= 4.5
    row = page.locator("table.sinks tr", has_text="#acme-oncall")
    assert "incident.opened · teams acme" in row.inner_text()
    sink = db.session.scalar(select(NotificationSink))
    assert (sink.name, sink.kinds) == ("#acme-oncall", ["incident.opened"])

    row.locator("button:text('Send a test message')").click()
    assert "Test message sent to #acme-oncall" in page.locator(".flash").inner_text()
    deliver_due(app, clock)
    [got] = [r for r in receiver.requests if r.path == "/ok"]
    assert json.loads(got.body)["type"] == "promesa.sink.test"
    page.click(".flash a")  # how the sink answered
    assert "\t200\t" in page.locator("main").inner_text()

    page.goto(live_url + "/sinks")
    row = page.locator("table.sinks tr", has_text="#acme-oncall")
    row.locator("summary:text('Change name or filter')").click()
    row.locator("input[name=name]").fill("#oncall")
    row.locator("input[name=teams][value=acme]").uncheck()
    row.locator("input[name=kinds][value='incident.resolved']").check()
    row.locator("button:text('Save')").click()
    assert page.locator(".flash").inner_text() == ("Sink #oncall changed (name, teams, notification kinds): it hears"
                                                   " incident.opened, incident.resolved · every team, and Promesa itself.")
    row = page.locator("table.sinks tr", has_text="#oncall")
    assert "incident.opened, incident.resolved · every team" in row.inner_text()
    row.locator("button:text('Remove')").click()
    assert page.dialogs[-1] == "Remove the sink #oncall? It gets no more notifications."
    assert "Sink removed" in page.locator(".flash").inner_text()
    assert_no_csp_violations(page)
