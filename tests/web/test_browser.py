"""The dashboard in a real browser (Debian's headless Chromium driven by Playwright):
an operator signs in, finds the broken subscription, replays its dead letters and pauses it."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from tests.support import pipeline
from tests.support.served import served

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def browser_page():
    if not CHROMIUM:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("Debian's chromium is not installed; browser tests need it")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page()
        page.set_default_timeout(15_000)
        # Every Content-Security-Policy violation, as the page sees it and as the console reports it.
        page.add_init_script("window.cspViolations = [];"
                             "document.addEventListener('securitypolicyviolation',"
                             " e => window.cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));")
        page.console_errors = []
        page.on("console", lambda msg: msg.type == "error" and page.console_errors.append(msg.text))
        # Confirmations (static/confirm.js) are accepted, and what they asked is kept for the test to read;
        # a test that answers "no" removes this handler first.
        page.dialogs = []

        def accept(dialog):
            page.dialogs.append(dialog.message)
            dialog.accept()

        page.accept_dialogs = accept
        page.on("dialog", accept)
        yield page
        browser.close()


def assert_no_csp_violations(page):
    assert page.evaluate("window.cspViolations") == []
    assert [m for m in page.console_errors if "Content Security Policy" in m] == []


@pytest.fixture
def live_url(app):
    with served(app) as url:
        yield url


def deliver_due(app, clock):
    # Playwright's sync API owns this thread's event loop; the engine runs its own in another thread.
    def run():
        with app.app_context():
            pipeline.deliver_due(app, clock)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(timeout=60)


def test_an_operator_replays_and_pauses_from_the_browser(app, producer, receiver, clock, users, live_url,
                                                          browser_page, tmp_path):
    sub = producer.subscribe(receiver.url + "/status/400", description="billing <hook>")
    for _ in range(2):
        producer.publish()
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(hours=1)
    page = browser_page

    page.goto(live_url + "/")
    page.fill("input[name=email]", "operator@example.com")
    page.fill("input[name=password]", "pw-operator")
    page.click("button[type=submit]")
    row = page.locator("tr", has_text=receiver.url)
    assert row.locator("a.bad").inner_text() == "2"  # two dead letters, shown in red
    assert page.locator("text=billing <hook>").count() == 1  # escaped text, rendered literally

    row.locator("a", has_text=receiver.url).click()
    page.click("text=Replay all dead letters")
    assert page.dialogs == ["Replay all 2 dead letters of this subscription?"]
    assert "Replaying 2 dead deliveries" in page.locator(".flash").inner_text()
    page.click("button:text('Pause')")
    assert page.locator("p .state").first.inner_text() == "paused"

    page.click("text=What this subscription is promised")
    assert page.locator("#snippet-typescript").inner_text().startswith("import { createHmac")
    page.wait_for_load_state("load")  # the deferred scripts have run
    assert page.evaluate("typeof htmx") == "object"  # the vendored htmx loads

    deliver_due(app, clock)
    page.screenshot(path=str(tmp_path / "subscription.png"), full_page=True)
    assert receiver.count() == 6  # the replayed deliveries wait, held, while the subscription is paused
    assert page.goto(live_url + f"/subscriptions/{sub['id']}?state=held").ok
    assert page.locator("td .state", has_text="held").count() == 2
    assert_no_csp_violations(page)


def test_the_overview_polls_under_the_content_security_policy(app, producer, receiver, users, live_url,
                                                              browser_page):
    page = browser_page
    page.clock.install()  # the page's timers run on a clock the test moves: no waiting for the 5 s poll
    page.goto(live_url + "/login")
    page.fill("input[name=email]", "operator@example.com")
    page.fill("input[name=password]", "pw-operator")
    page.click("button[type=submit]")
    assert "No subscriptions yet" in page.locator("#subscriptions").inner_text()
    page.wait_for_load_state("load")  # htmx reads its <meta> config once the document is parsed, after the text shows
    assert page.evaluate("htmx.config.includeIndicatorStyles") is False

    producer.subscribe(receiver.url + "/hook", description="appeared while watching")
    with page.expect_response(lambda r: r.request.headers.get("hx-request") == "true") as polled:
        page.clock.run_for(6_000)
    assert polled.value.ok
    # The response can reach the test before the page's XHR handler has swapped it in: wait for the swap.
    page.locator("#subscriptions").get_by_text("appeared while watching").wait_for()
    page.clock.run_for(1_000)  # htmx settles the swap on a timer
    assert page.locator("style").count() == 0  # htmx injected no inline style
    assert_no_csp_violations(page)


SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"


def test_an_owner_rotates_a_secret_and_sees_it_once(app, producer, receiver, clock, users, live_url, browser_page):
    sub = producer.subscribe(receiver.url + "/ok")
    page = browser_page
    page.goto(live_url + "/login")
    page.fill("input[name=email]", "owner@example.com")
    page.fill("input[name=password]", "pw-owner")
    page.click("button[type=submit]")
    page.goto(live_url + f"/subscriptions/{sub['id']}")
    assert "Signing with one secret" in page.locator(".owner-tools .signing").inner_text()

    page.select_option("select[name=grace_seconds]", "3600")
    page.click("button:text('Rotate secret')")  # htmx: the answer lands in the panel, the URL stays
    assert page.dialogs[-1].startswith("Rotate the signing secret?")
    shown = page.locator("#new-secret").inner_text().strip()
    from dashboard.core import crypto
    from dashboard.core.extensions import db
    from dashboard.models import Subscription

    db.session.expire_all()
    assert shown == crypto.decrypt(db.session.get(Subscription, sub["id"]).secret_ciphertext)
    assert shown != sub["secret"]
    assert "the previous one until" in page.locator(".owner-tools .signing").inner_text()  # updated in place
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "owner-rotates-a-secret.png"), full_page=True)

    page.reload()  # the secret was in that answer only
    assert page.locator("#new-secret").count() == 0 and shown not in page.content()
    assert "the previous one until" in page.locator(".owner-tools .signing").inner_text()

    page.click("button:text('Send test event')")  # the outcome appears inline once the worker has tried
    assert "waiting for the endpoint" in page.locator(".test-result").inner_text()
    deliver_due(app, clock)
    page.wait_for_selector(".test-result.ok")
    assert "HTTP 200" in page.locator(".test-result").inner_text()
    got = receiver.requests[-1]
    assert got.headers["X-Event-Type"] == "promesa.test" and got.headers["X-Signature"].count("v1=") == 2
