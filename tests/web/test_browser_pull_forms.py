"""A pull subscription made and edited in a real browser on a 400 px phone, on the dashboard and in the portal:
choosing pull hides push's boxes, the created page shows where to pull, the edit form has none of push's boxes,
and nothing is wider than the screen."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import Subscription

from tests.support.browser import PHONE, assert_fits, assert_on_screen, sign_in
from tests.support.portal import link_path
from tests.web.test_browser import assert_no_csp_violations, browser_page, live_url  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


def create_and_edit_a_pull_subscription(page, new_url: str, create: str, description: str) -> Subscription:
    """From the new form with pull chosen to the created page and the edit form, each fitting the phone."""
    page.goto(new_url)
    assert page.locator("input[name=url]").is_visible()  # push is the default
    page.check("input[name=mode][value=pull]")
    for push_only in ("input[name=url]", "input[name=connect_timeout]", "input[name=auth_token_url]"):
        assert not page.locator(push_only).is_visible(), push_only
    page.fill("input[name=description]", description)
    page.fill("textarea[name=filter]", '{"data.region": "eu"}')
    assert_fits(page)
    page.click(f"button:text('{create}')")
    page.wait_for_url("**/subscriptions/*/created")
    sub = db.session.scalar(select(Subscription).where(Subscription.description == description))
    assert (sub.mode, sub.url, sub.filter) == ("pull", None, {"data.region": "eu"})
    assert_on_screen(page.locator("#new-secret"))
    assert_on_screen(page.locator("#new-pull-key"))
    assert_on_screen(page.locator("#how-to-pull pre"))
    assert_fits(page)
    page.click("text=Open the")
    page.click("a:text-is('Edit')")
    page.wait_for_url(f"**/subscriptions/{sub.id}/edit")
    assert page.locator("input[name=url], input[name=connect_timeout]").count() == 0
    assert_fits(page)
    page.fill("input[name=description]", description + ", eu")
    page.click("button:text('Save')")
    page.wait_for_url(f"**/subscriptions/{sub.id}")
    db.session.expire_all()
    assert db.session.get(Subscription, sub.id).description == description + ", eu"
    page.once("dialog", lambda dialog: dialog.accept())  # "Replace the pull key?"
    page.click("button:text('Replace pull key')")
    page.wait_for_url(f"**/subscriptions/{sub.id}/pull-key")
    assert_on_screen(page.locator("#new-pull-key"))
    assert_fits(page)
    return sub


def test_a_pull_subscription_is_created_and_edited_on_a_phone_on_the_dashboard_and_in_the_portal(
        app, producer, users, live_url, browser_page):  # noqa: F811
    page = browser_page
    page.set_viewport_size(PHONE)
    sign_in(page, live_url, "owner")
    create_and_edit_a_pull_subscription(page, live_url + "/subscriptions/new", "Create subscription", "loader")
    assert_no_csp_violations(page)

    producer.put_consumer("cus_1")
    page.context.clear_cookies()
    page.goto(live_url + link_path(producer, "cus_1"))
    page.wait_for_url(f"{live_url}/portal/")
    sub = create_and_edit_a_pull_subscription(page, live_url + "/portal/endpoints/new", "Create endpoint", "batch")
    assert sub.consumer.uid == "cus_1"
    assert_no_csp_violations(page)
