"""Dead letters and bulk replay in a real browser (Debian's headless Chromium via Playwright): an operator
filters the dead letters and replays the matching ones, the progress bar reaches the end while a real
receiver gets each event; an on-call engineer sees the same page with no buttons, and a forged POST is refused."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
from rq.timeouts import TimerDeathPenalty

from dashboard.delivery import jobs
from dashboard.delivery.worker import DeliveryWorker
from dashboard.queue import lanes
from dashboard.queue.work import WorkQueue

from tests.conftest import _csrf_from
from tests.web.test_browser import assert_no_csp_violations, browser_page, deliver_due, live_url  # noqa: F401  (fixtures)
from tests.operations.test_replays import fix_receiver, make_dead

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"


class ThreadWorker(DeliveryWorker):
    """`promesa worker`'s SimpleWorker, in a thread of this process (signals belong to the main thread)."""

    death_penalty_class = TimerDeathPenalty

    def _install_signal_handlers(self):
        pass


def start_worker(app) -> threading.Thread:
    """Run the queued jobs (the replay, then the drain jobs it starts) while the browser watches."""
    def run():
        work = WorkQueue.for_app(app)
        with app.app_context():
            ThreadWorker([*(lanes.queue(lane, app).name for lane in lanes.LANES), work.rq.name],
                         connection=work.conn).work(burst=True)
            engine = jobs._engines.pop(id(app), None)
            if engine is not None:
                engine.close()

    worker = threading.Thread(target=run)
    worker.start()
    return worker


def sign_in(page, base, role):
    page.goto(base + "/login")
    page.fill("input[name=email]", f"{role}@example.com")
    page.fill("input[name=password]", "pw-" + role)
    page.click("button[type=submit]")


def test_an_operator_replays_the_matching_dead_letters_and_watches_them_arrive(
        app, producer, receiver, clock, users, live_url, browser_page):  # noqa: F811
    app.config["PROMESA_REPLAY_CHUNK"] = 2
    app.config["PROMESA_DRAIN_LINGER_SECONDS"] = 0.0
    sub, dead = make_dead(app, clock, producer, receiver, 400, ["file.updated"] * 3, deliver_due)
    make_dead(app, clock, producer, receiver, 404, ["order.paid"] * 2, deliver_due)  # another subscription's, left alone
    fix_receiver(sub, receiver)
    before = receiver.count()
    page = browser_page
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    sign_in(page, live_url, "operator")
    page.click("nav >> text=Dead letters")
    assert page.locator("#matching").inner_text() == "5"
    page.select_option("select[name=subscription]", sub)
    page.click("button:text('Filter')")
    assert page.locator("#matching").inner_text() == "3"
    from playwright.sync_api import expect

    expect(page.locator("input[name=delivery_id]")).to_have_count(3)  # the rows below the count, once parsed
    page.screenshot(path=str(SCREENSHOTS / "dead-letters.png"), full_page=True)

    page.click("button:text('Replay the 3 matching')")
    assert page.dialogs[-1] == "Replay the 3 matching dead letters?"
    assert "Replaying 3 dead letters" in page.locator(".flash").inner_text()
    assert page.locator(".replay-total").inner_text() == "3"
    worker = start_worker(app)
    # The partial polls itself: the bar reaches the end and every outcome comes in, without a reload.
    page.wait_for_selector(".replay-succeeded:text-is('3')", timeout=30_000)
    worker.join(timeout=60)
    assert page.locator(".replay-done").inner_text() == "3"
    assert page.locator("progress").get_attribute("value") == "3"
    assert page.locator(".state", has_text="finished").count() == 1
    page.screenshot(path=str(SCREENSHOTS / "replay-progress.png"), full_page=True)
    assert_no_csp_violations(page)  # the polling partial and the bar work under the strict policy

    got = [json.loads(r.body)["id"] for r in receiver.requests[before:]]
    assert sorted(got) == sorted(dead.values())  # each event, once, at the repaired endpoint
    page.goto(live_url + "/dead-letters")
    assert page.locator("#matching").inner_text() == "2"


def test_oncall_sees_dead_letters_without_buttons_and_a_forged_post_is_refused(
        app, producer, receiver, clock, users, live_url, browser_page):  # noqa: F811
    sub, dead = make_dead(app, clock, producer, receiver, 400, ["file.updated"] * 2, deliver_due)
    page = browser_page
    sign_in(page, live_url, "oncall")
    page.goto(live_url + "/dead-letters")
    assert page.locator("#matching").inner_text() == "2"
    assert page.locator("button", has_text=re.compile("Replay")).count() == 0
    assert page.locator("input[type=checkbox]").count() == 0
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "dead-letters-oncall.png"), full_page=True)
    assert_no_csp_violations(page)

    token = _csrf_from(page.content())  # a valid session and CSRF token: only the role is missing
    forged = page.request.post(live_url + "/dead-letters/replay", form={"csrf_token": token, "which": "matching"},
                               max_redirects=0)
    assert forged.status == 403
    forged = page.request.post(live_url + f"/subscriptions/{sub}/replays",
                               form={"csrf_token": token, "since": "2000-01-01T00:00"}, max_redirects=0)
    assert forged.status == 403
    page.goto(live_url + "/dead-letters")
    assert page.locator("#matching").inner_text() == "2"  # nothing was replayed
