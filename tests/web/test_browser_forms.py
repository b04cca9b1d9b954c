"""The forms of issue 36 in a real browser, at a desktop's width and a phone's: a new subscription and a
new token show their secret once and a reload creates nothing; a deleted subscription's page says so
and offers nothing to do."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from dashboard.core import crypto
from dashboard.core.extensions import db
from dashboard.models import ApiToken, Subscription
from tests.support.browser import DESKTOP, PHONE, assert_fits, sign_in
from tests.support.client_tls import CertificateAuthority
from tests.web.test_browser import browser_page, live_url  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


def _fits_at_both_widths(page) -> None:
    for size in (DESKTOP, PHONE):
        page.set_viewport_size(size)
        assert_fits(page)
    page.set_viewport_size(DESKTOP)


def _count(model, *where) -> int:
    db.session.expire_all()
    return db.session.scalar(select(func.count()).select_from(model).where(*where))


def test_created_secrets_show_once_a_reload_creates_nothing_and_a_deleted_page_offers_nothing(
        app, receiver, users, live_url, browser_page):  # noqa: F811
    page = browser_page
    page.set_viewport_size(DESKTOP)
    sign_in(page, live_url, "owner")

    page.click("nav >> text=New subscription")
    assert page.locator("input[name=event_types][value='*']").is_checked()  # "All event types", the default
    _fits_at_both_widths(page)
    page.fill("input[name=url]", receiver.url + "/hook")
    expiring = CertificateAuthority().issue("browser", days=(-1, 10))  # a client certificate the page warns about
    page.fill("textarea[name=tls_certificate]", expiring.certificate)
    page.fill("textarea[name=tls_key]", expiring.key)
    page.click("button:text('Create subscription')")
    page.wait_for_url("**/created")
    shown = page.locator("#new-secret").inner_text().strip()
    sub = db.session.scalar(select(Subscription).where(Subscription.url == receiver.url + "/hook"))
    assert shown == crypto.decrypt(sub.secret_ciphertext) and sub.event_types == ["*"]
    _fits_at_both_widths(page)
    page.reload()
    assert page.locator("#new-secret").count() == 0 and shown not in page.content()
    assert "was shown once" in page.locator("main").inner_text()
    assert _count(Subscription, Subscription.url == receiver.url + "/hook") == 1
    _fits_at_both_widths(page)

    page.click("nav >> text=Tokens")
    page.fill("input[name=name]", "billing producer")
    page.click("button:text('Create a token')")
    token = page.locator("#one-time-secret").inner_text().strip()
    _fits_at_both_widths(page)
    page.reload()
    assert page.locator("#one-time-secret").count() == 0 and token not in page.content()
    assert _count(ApiToken, ApiToken.name == "billing producer") == 1
    _fits_at_both_widths(page)

    page.goto(f"{live_url}/subscriptions/{sub.id}/edit")
    assert "O=Tests,CN=browser" in page.locator("#saved-certificate").inner_text()
    _fits_at_both_widths(page)
    page.goto(f"{live_url}/subscriptions/{sub.id}")
    assert "expires on" in page.locator("#certificate-expiring").inner_text()
    _fits_at_both_widths(page)
    page.click("summary:text('Delete…')")
    page.check("input[name=confirm]")
    page.click("button:text('Delete this subscription')")
    page.wait_for_url(f"**/subscriptions/{sub.id}")
    assert "no deliveries were waiting" in page.locator(".flash").inner_text()
    assert page.locator("#current-state .state").inner_text() == "deleted"
    assert page.locator(f"form[action^='/subscriptions/{sub.id}']").count() == 0
    _fits_at_both_widths(page)
