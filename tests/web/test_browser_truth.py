"""The pages of issue 36's findings 4 and 6 in a real browser, at a desktop's width and a phone's: the receiver
check's card blaming a wrong secret and showing each answer's body as text, the audit log in words, the dead
letters filtered to one subscription with the warning before a replay, and a replay's page."""

from __future__ import annotations

import pytest

from dashboard.core.extensions import db
from dashboard.models import Subscription
from dashboard.operations import replays

from tests.operations.test_replays import make_dead
from tests.sdk.conftest import REFUSAL_BODY, wrong_secret_receiver  # noqa: F401  (fixture)
from tests.support.browser import DESKTOP, PHONE, assert_fits, assert_on_screen, sign_in
from tests.web.test_browser import browser_page, deliver_due, live_url  # noqa: F401  (fixtures and a helper)
from tests.web.test_browser_replays import start_worker

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


def test_the_check_card_audit_log_dead_letters_and_a_replay_fit_and_tell_the_truth(
        app, producer, receiver, clock, users, live_url, browser_page, wrong_secret_receiver):  # noqa: F811
    checked = producer.subscribe(wrong_secret_receiver.url, description="billing hook")
    producer.post(f"/api/v1/subscriptions/{checked['id']}/checks")
    start_worker(app).join(timeout=60)  # the check against the receiver holding the wrong secret (in a thread:
    db.session.expire_all()  # the browser's event loop holds this one)
    failing, _ = make_dead(app, clock, producer, receiver, 400, ["file.updated"], deliver=deliver_due)
    db.session.get(Subscription, failing).description = "search hook"
    db.session.commit()
    replay, _ = replays.start(replays.DeadLetterFilter(subscription_id=failing))
    producer.publish("file.updated")
    deliver_due(app, clock)  # the endpoint fails again now
    clock.advance(seconds=40)
    page = browser_page
    sign_in(page, live_url, "operator")

    for viewport in (DESKTOP, PHONE):
        page.set_viewport_size(viewport)
        page.goto(f"{live_url}/subscriptions/{checked['id']}")
        card = page.locator("#receiver-check")
        assert card.locator("tr[data-rule=signed_accepted] td").first.inner_text() == "fail"
        duplicate = card.locator("tr[data-rule=duplicate_accepted]")
        assert duplicate.locator("td").first.inner_text() == "not judged"
        assert "the correctly signed event was not accepted" in duplicate.inner_text()
        assert "HTTP 401" in duplicate.inner_text()
        assert duplicate.locator("pre.excerpt").inner_text() == REFUSAL_BODY  # the markup, shown as text
        assert_on_screen(duplicate.locator("pre.excerpt"))
        assert_fits(page)

        page.goto(f"{live_url}/audit")
        assert page.locator("td", has_text=f"billing hook · {checked['id']}").count() >= 1
        assert "[]" not in page.locator("table.audit").inner_text()
        assert_fits(page)

        page.goto(f"{live_url}/dead-letters?subscription={failing}")
        warning = page.locator(".replay-warning")
        assert "its last attempt failed 40 s ago with HTTP 400 (client error)" in warning.inner_text()
        assert_on_screen(warning)
        assert page.locator("select[name=subscription] option:checked").inner_text().startswith(
            f"search hook · {failing} — ")
        assert_fits(page)

        page.goto(f"{live_url}/replays/{replay.id}")
        assert f"search hook · {failing}" in page.locator("dl.facts").inner_text()
        assert_fits(page)
