"""Admins are told when notification links cannot work;
the pages carry the narrow-screen and button styles; one-time secrets are readable."""

from __future__ import annotations

import logging

import pytest

from dashboard.app import BASE_URL_SAID, create_app
from dashboard.core import config as config_module
from dashboard.core.extensions import db

from tests.conftest import Auth, _csrf_from

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


def test_without_a_base_url_the_start_says_so_once_and_admins_see_a_banner_they_can_hide(config, users, caplog,
                                                                                         monkeypatch):
    monkeypatch.setenv(BASE_URL_SAID, "")  # a fresh start: nothing said yet in this process
    monkeypatch.setenv(config_module.SERVED_URL, "http://127.0.0.1:5101")  # as `promesa up --port 5101` sets it
    with caplog.at_level(logging.WARNING, logger="dashboard.app"):
        unset = [create_app(config) for _ in range(3)][-1]  # web, workers and sweeper each make an app
    said = [record.getMessage() for record in caplog.records if "PROMESA_BASE_URL" in record.getMessage()]
    assert len(said) == 1 and "point at http://127.0.0.1:5101 " in said[0]
    client = unset.test_client()
    Auth(client).login("admin")
    overview = client.get("/").get_data(as_text=True)
    assert 'id="base-url-banner"' in overview and "http://127.0.0.1:5101, which works only" in overview
    assert 'id="base-url-banner"' in client.get("/sinks").get_data(as_text=True)
    assert 'id="base-url-banner"' not in client.get("/users").get_data(as_text=True)  # where notification links matter
    assert client.get("/base-url-banner/hide").status_code == 405
    assert client.post("/base-url-banner/hide", data={"back": "/sinks"}).status_code == 400  # no CSRF token
    hidden = client.post("/base-url-banner/hide", data={"back": "/sinks", "csrf_token": _csrf_from(overview)})
    assert hidden.status_code == 302 and hidden.headers["Location"] == "/sinks"
    assert 'id="base-url-banner"' not in client.get("/sinks").get_data(as_text=True)
    assert 'id="base-url-banner"' not in client.get("/").get_data(as_text=True)
    Auth(client).login("operator")
    assert 'id="base-url-banner"' not in client.get("/").get_data(as_text=True)  # admins only: they can fix it
    Auth(client).login("admin")
    assert 'id="base-url-banner"' in client.get("/").get_data(as_text=True)  # until the next sign-in
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dashboard.app"):
        set_ = create_app({**config, "PROMESA_BASE_URL": "https://promesa.example"})
    assert "PROMESA_BASE_URL" not in caplog.text
    client = set_.test_client()
    Auth(client).login("admin")
    assert 'id="base-url-banner"' not in client.get("/").get_data(as_text=True)
    db.session.remove()


def test_the_page_tools_script_and_styles_are_static_files(client, auth, users):
    auth.login("owner")
    page = client.get("/tokens").get_data(as_text=True)
    assert '<script src="/static/page-tools.js" defer></script>' in page and "<script>" not in page
    assert 'data-toggles="main-nav"' in page and 'id="main-nav"' in page
    script = client.get("/static/page-tools.js").get_data(as_text=True)
    assert "data-copy" in script and "data-toggles" in script
    css = client.get("/static/promesa.css").get_data(as_text=True)
    for rule in ("button.primary", "button.secondary", "button.danger", "table.cards", "@media (max-width: 720px)",
                 ".secret-value"):
        assert rule in css
