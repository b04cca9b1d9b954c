"""A member changes their password in a real browser (Debian's headless Chromium, as tests/web/test_browser.py)
on a 400 px phone: the page fits, a weak password is refused with the reason, a good one is taken, and the
old password no longer signs in."""

from __future__ import annotations

import pytest

from dashboard.core.extensions import db
from dashboard.models import AuditEntry

from tests.web.test_browser import assert_no_csp_violations, browser_page, live_url  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]
NEW = "harbour velvet quartz"


def _sign_in(page, live_url, password):  # noqa: F811
    page.goto(live_url + "/login")
    page.fill("input[name=email]", "member@example.com")
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_load_state("load")


def _fits_the_phone(page) -> bool:
    page.wait_for_load_state("load")  # the stylesheet applied
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def test_a_member_changes_their_password_on_a_phone(app, users, live_url, browser_page):  # noqa: F811
    page = browser_page
    page.set_viewport_size({"width": 400, "height": 860})
    _sign_in(page, live_url, "pw-member")
    page.click("button.nav-toggle")  # the name in the top bar is hidden on a phone: the menu has the link
    page.click("#main-nav a:has-text('Your password')")
    page.wait_for_load_state("load")
    assert page.locator("h1").inner_text() == "Change your password"
    assert _fits_the_phone(page)

    page.fill("input[name=current]", "pw-member")
    page.fill("input[name=new]", "Password2026!")
    page.fill("input[name=repeat]", "Password2026!")
    page.click("button:has-text('Change password')")
    assert "guessers" in page.locator(".flash.error").inner_text() and _fits_the_phone(page)

    page.fill("input[name=current]", "pw-member")
    page.fill("input[name=new]", NEW)
    page.fill("input[name=repeat]", NEW)
    page.click("button:has-text('Change password')")
    page.wait_for_load_state("load")
    assert page.url == live_url + "/account/password"  # post/redirect/get: a reload sends nothing again
    assert "Your password is changed" in page.locator(".flash.ok").inner_text() and _fits_the_phone(page)
    assert_no_csp_violations(page)

    page.click("button:has-text('Sign out')")
    _sign_in(page, live_url, "pw-member")
    assert page.url.startswith(live_url + "/login")  # the old password no longer works
    _sign_in(page, live_url, NEW)
    assert not page.url.startswith(live_url + "/login")
    db.session.expire_all()
    assert db.session.query(AuditEntry).filter_by(action="user.password_changed").count() == 1
