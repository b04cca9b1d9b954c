"""Roles, refusals and the PROMESA_BASE_URL banner in a real browser, at a desktop's width and a phone's: the
Users page (the roles table, a new user a member by default, a reload that creates nothing), the banner an admin
hides for the session, and the 403 page a member gets, inside the dashboard with a way back."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.models import User

from tests.support.browser import DESKTOP, PHONE, assert_fits, assert_on_screen, sign_in
from tests.web.test_browser import browser_page, live_url  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


def test_users_page_banner_and_refusal_fit_and_say_the_truth(app, users, live_url, browser_page):
    page = browser_page
    sign_in(page, live_url, "admin")
    banner = page.locator("#base-url-banner")
    for size in (DESKTOP, PHONE):
        page.set_viewport_size(size)
        page.goto(live_url + "/")
        assert_on_screen(banner.get_by_role("button", name="Hide until I sign in again"))
        assert_fits(page)
        page.goto(live_url + "/users")
        assert banner.count() == 0  # only where notification links matter
        assert page.locator("select[name=role]").first.input_value() == "member"
        assert_on_screen(page.locator("details.roles dt", has_text="oncall"))
        assert_fits(page)

    page.fill("input[name=email]", "new@example.com")
    page.fill("form[aria-label='Create a user'] input[name=team]", "acme")  # a member belongs to a team
    page.get_by_role("button", name="Create user").click()
    page.wait_for_url(live_url + "/users")
    assert_on_screen(page.locator("#one-time-secret"))
    assert "(member)" in page.locator("main").inner_text()
    page.reload()  # a GET: nothing is created again, and the password is not shown again
    assert page.locator("#one-time-secret").count() == 0 and "already exists" not in page.content()
    assert db.session.scalar(select(func.count()).select_from(User).where(User.email == "new@example.com")) == 1

    page.goto(live_url + "/")
    banner.get_by_role("button", name="Hide until I sign in again").click()
    page.wait_for_url(live_url + "/")
    assert banner.count() == 0
    page.goto(live_url + "/sinks")
    assert banner.count() == 0  # hidden for the rest of the session

    page.context.clear_cookies()  # a new session, as another person
    sign_in(page, live_url, "member")
    for size in (DESKTOP, PHONE):
        page.set_viewport_size(size)
        page.goto(live_url + "/users", referer=live_url + "/audit")  # as if followed from the audit log
        assert page.locator("h1").inner_text() == "Not allowed"
        assert "Your role may not manage users: admins may." in page.locator("main").inner_text()
        assert page.locator("header .nav-toggle, #main-nav").count() >= 1
        assert_fits(page)
    page.get_by_role("link", name="← Back").click()
    page.wait_for_url(live_url + "/audit")
