"""The receiver check in a real browser (Debian's headless Chromium via Playwright): an owner runs it from
the subscription page, the report card polls itself until the job (a real RQ worker) has finished, and
shows pass, fail and not judged with the advice; an on-call engineer reads it with no button."""

from __future__ import annotations

import pytest

from tests.web.test_browser import assert_no_csp_violations, browser_page, live_url  # noqa: F401  (fixtures)
from tests.web.test_browser_replays import SCREENSHOTS, sign_in, start_worker

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


def test_an_owner_runs_the_receiver_check_and_reads_the_report_card(
        app, producer, receiver, users, live_url, browser_page):  # noqa: F811
    sub = producer.subscribe(receiver.url + "/ok", description="answers 200 to anything")
    page = browser_page
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    sign_in(page, live_url, "owner")
    page.goto(live_url + f"/subscriptions/{sub['id']}")
    assert "No check has run yet" in page.locator("#receiver-check").inner_text()
    page.click("button:text('Run receiver check')")
    assert "started" in page.locator(".flash").inner_text()
    assert "is running" in page.locator("#receiver-check").inner_text()
    assert page.locator("button:text('Run receiver check')").count() == 0  # one at a time

    worker = start_worker(app)
    # The card asks again every second and swaps itself in once the check has finished: no reload.
    page.wait_for_selector("#receiver-check tr[data-rule=forged_rejected]", timeout=30_000)
    worker.join(timeout=60)
    card = page.locator("#receiver-check")
    assert "4 passed" in card.inner_text() and "3 failed" in card.inner_text()
    marks = {rule: card.locator(f"tr[data-rule={rule}] td").first.inner_text()
             for rule in ("signed_accepted", "forged_rejected", "stale_rejected", "tampered_rejected", "https")}
    assert marks == {"signed_accepted": "pass", "forged_rejected": "fail", "stale_rejected": "fail",
                     "tampered_rejected": "fail", "https": "not judged"}
    advice = card.locator("tr[data-rule=forged_rejected] td").nth(3).inner_text()
    assert advice.startswith("your endpoint accepted a request signed with the wrong secret")
    page.screenshot(path=str(SCREENSHOTS / "receiver-check.png"), full_page=True)
    assert_no_csp_violations(page)  # the polling card works under the strict policy

    card.locator("a", has_text="TypeScript").click()
    assert page.url.endswith("/contract#snippet-typescript")
    assert "must not skip verification" in page.locator("#receiver-check").inner_text()

    page.goto(live_url + "/")
    assert page.locator("a.check-failed").count() == 1  # the overview marks it

    page.context.clear_cookies()  # signed out
    sign_in(page, live_url, "oncall")
    page.goto(live_url + f"/subscriptions/{sub['id']}")
    assert "3 failed" in page.locator("#receiver-check").inner_text()
    assert page.locator("button:text('Run receiver check')").count() == 0  # reads, does not run
