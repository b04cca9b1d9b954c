"""Failed sign-ins under concurrency: guesses fired at once at a real server get exactly the limit through."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request

import pytest

from dashboard.app import create_app

from tests.support.served import at_once, served


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a signed-in answer is the 302 itself


class Browser:
    """A sign-in page opened with its own cookies, ready to post the form."""

    def __init__(self, url: str):
        self.url = url
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()),
                                                  _NoRedirects())
        with self.opener.open(url + "/login", timeout=30) as page:
            self.token = re.search(r'name="csrf_token" value="([^"]+)"', page.read().decode()).group(1)

    def sign_in(self, email: str, password: str) -> int:
        form = urllib.parse.urlencode({"email": email, "password": password, "csrf_token": self.token}).encode()
        try:
            with self.opener.open(self.url + "/login", data=form, timeout=60) as answer:
                return answer.status
        except urllib.error.HTTPError as answer:
            return answer.code


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_concurrent_guesses_get_exactly_the_limit_through(config, users):
    app = create_app({**config, "PROMESA_LOGIN_LIMIT_PER_ADDRESS": "8 per 15 minutes"})
    with served(app) as url:
        for _ in range(3):  # sign-ins that succeed take their attempt back from the address
            assert Browser(url).sign_in("operator@example.com", "pw-operator") == 302

        guessers = [Browser(url) for _ in range(20)]
        one_account = at_once([lambda b=b: b.sign_in("admin@example.com", "wrong") for b in guessers])
        assert sorted(one_account) == [401] * 5 + [429] * 15  # the account's limit: 5

        guessers = [Browser(url) for _ in range(20)]
        many_accounts = at_once([lambda b=b, n=n: b.sign_in(f"nobody{n}@example.com", "guess")
                                 for n, b in enumerate(guessers)])
        assert sorted(many_accounts) == [401] * 3 + [429] * 17  # the address's 8, of which 5 were spent above
        assert Browser(url).sign_in("operator@example.com", "pw-operator") == 429
