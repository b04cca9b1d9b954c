"""Admins are told when notification links cannot work;
the pages carry the narrow-screen and button styles; one-time secrets are readable."""

from __future__ import annotations

import logging

import pytest

from dashboard.app import create_app
from dashboard.core.extensions import db

from tests.conftest import Auth

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


def test_without_a_base_url_admins_see_a_banner_and_the_start_logs_a_warning(config, users, caplog):
    with caplog.at_level(logging.WARNING, logger="dashboard.app"):
        unset = create_app(config)
    assert "PROMESA_BASE_URL is not set" in caplog.text
    client = unset.test_client()
    Auth(client).login("admin")
    assert 'id="base-url-banner"' in client.get("/").get_data(as_text=True)
    Auth(client).login("operator")
    assert 'id="base-url-banner"' not in client.get("/").get_data(as_text=True)  # admins only: they can fix it
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
    for rule in ("button.primary", "button.secondary", "button.danger", ".table-scroll", "@media (max-width: 720px)",
                 ".secret-value"):
        assert rule in css
