"""Creating a subscription from the dashboard: the API's model and service behind a form, event types
picked from the catalog (patterns allowed), and the secret shown once."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import func, select

from dashboard.core import crypto
from dashboard.delivery import policies
from dashboard.subscriptions import contract
from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Subscription

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]

FORM = {"description": "billing", "retry_policy": "quick-then-sweep", "signature_scheme": "standard-webhooks",
        "connect_timeout": "2", "attempt_timeout": "4", "max_age_seconds": "3600", "rate_limit_per_s": "5",
        "max_in_flight": "2"}


def _declare(producer, name):
    resp = producer.post("/api/v1/event-types", {"name": name, "version": 1, "schema": {"type": "object"}})
    assert resp.status_code in (200, 201), resp.get_json()


def test_an_owner_creates_a_subscription_from_the_catalog_and_sees_its_secret_once(client, auth, producer, receiver,
                                                                                   users):
    _declare(producer, "invoice.paid")
    _declare(producer, "invoice.voided")
    auth.login("owner")
    page = client.get("/subscriptions/new").get_data(as_text=True)
    assert 'value="invoice.paid"' in page and 'value="invoice.voided"' in page  # the catalog, as boxes to tick
    assert 'value="promesa.incident.opened"' in page

    resp = client.post("/subscriptions/new", data={
        **FORM, "csrf_token": auth.csrf(), "team": "acme", "url": receiver.url + "/hook",
        "event_types": ["invoice.paid", "promesa.incident.opened"], "event_patterns": "file.*, file.*"})
    sub = db.session.scalar(select(Subscription).where(Subscription.url == receiver.url + "/hook"))
    assert resp.status_code == 303 and resp.headers["Location"] == f"/subscriptions/{sub.id}/created"
    assert resp.get_data(as_text=True).count("whsec_") == 0  # the secret is on the page it leads to, not here
    resp = client.get(resp.headers["Location"])
    assert resp.status_code == 200 and resp.headers["Cache-Control"] == "no-store"
    assert sub.event_types == ["invoice.paid", "promesa.incident.opened", "file.*"]
    assert (sub.retry_policy, sub.signature_scheme, sub.connect_timeout, sub.attempt_timeout, sub.max_age_seconds,
            sub.rate_limit_per_s, sub.max_in_flight, sub.description) == \
        ("quick-then-sweep", "standard-webhooks", 2, 4, 3600, 5, 2, "billing")
    secret = crypto.decrypt(sub.secret_ciphertext)
    html = resp.get_data(as_text=True)
    assert re.search(r'id="new-secret">([^<]+)<', html).group(1) == secret
    assert 'data-copy="new-secret"' in html
    assert f'action="/subscriptions/{sub.id}/checks"' in html and "Run receiver check" in html  # offered, not run
    assert secret not in client.get(f"/subscriptions/{sub.id}").get_data(as_text=True)
    again = client.get(f"/subscriptions/{sub.id}/created").get_data(as_text=True)  # a reload: shown once only
    assert secret not in again and "was shown once" in again
    assert db.session.scalar(select(func.count()).select_from(Subscription)
                             .where(Subscription.url == receiver.url + "/hook")) == 1
    [created] = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "subscription.created",
                                                           AuditEntry.subscription_id == sub.id))
    assert created.actor == "owner@example.com" and secret not in str(created.detail)

    edit = client.get(f"/subscriptions/{sub.id}/edit").get_data(as_text=True)  # chosen the same way
    assert re.search(r'value="invoice.paid" checked', edit) and not re.search(r'value="invoice.voided" checked', edit)
    assert 'name="event_patterns" value="file.*"' in edit


def test_the_forms_rules_are_the_apis(client, auth, producer, users):
    auth.login("owner")
    count = lambda: db.session.scalar(select(func.count()).select_from(Subscription))  # noqa: E731
    before = count()
    for bad, says in [({"url": "ftp://x"}, "url must be"), ({"url": "https://example.com", "event_types": "bad type!"},
                                                            "event_types"),
                      ({"url": "https://example.com", "connect_timeout": "99"}, "connect_timeout"),
                      ({"url": "https://example.com", "signature_scheme": "md5"}, "signature_scheme"),
                      ({"url": "https://example.com", "connect_timeout": "soon"}, "connect_timeout")]:
        resp = client.post("/subscriptions/new", data={**FORM, "csrf_token": auth.csrf(), "team": "acme",
                                                       "event_types": "*", **bad})
        assert resp.status_code == 400, bad
        assert says in resp.get_data(as_text=True)
    assert count() == before


def test_an_admin_chooses_the_team_and_an_owner_cannot_create_for_another(client, auth, producer, receiver, users):
    auth.login("admin")
    assert "Choose the team first" in client.get("/subscriptions/new").get_data(as_text=True)
    resp = client.post("/subscriptions/new", data={**FORM, "csrf_token": auth.csrf(), "team": "other",
                                                   "url": receiver.url + "/x", "event_types": "*"})
    assert resp.status_code == 303
    assert db.session.scalar(select(Subscription).where(Subscription.url == receiver.url + "/x")).team.name == "other"
    auth.login("owner")
    resp = client.post("/subscriptions/new", data={**FORM, "csrf_token": auth.csrf(), "team": "other",
                                                   "url": receiver.url + "/y", "event_types": "*"})
    assert resp.status_code == 303  # the owner's own team, whatever was posted
    assert db.session.scalar(select(Subscription).where(Subscription.url == receiver.url + "/y")).team.name == "acme"


def test_ticking_no_event_type_is_a_form_error_never_a_silent_star(client, auth, receiver, users):
    auth.login("owner")
    page = client.get("/subscriptions/new").get_data(as_text=True)
    assert re.search(r'value="\*" checked>\s*<span>All event types', page)  # the default, said in words
    resp = client.post("/subscriptions/new", data={**FORM, "csrf_token": auth.csrf(), "team": "acme",
                                                   "url": receiver.url + "/none", "event_patterns": " "})
    assert resp.status_code == 400 and "choose the event types" in resp.get_data(as_text=True)
    assert db.session.scalar(select(Subscription).where(Subscription.url == receiver.url + "/none")) is None


def test_the_form_says_what_each_retry_policy_does(client, auth, users):
    auth.login("owner")
    page = client.get("/subscriptions/new").get_data(as_text=True)
    exponential = policies.ExponentialPolicy()
    total = sum(high for _, _, high in exponential.schedule())
    assert f"<code>exponential</code>: {exponential.max_attempts} attempts" in page
    assert f"{contract.human(total)} after the first, then the delivery is dead-lettered" in page
    assert "<code>quick-then-sweep</code>: 3 quick attempts 0.5 s apart" in page and "24 h old" in page
    typed = client.post("/subscriptions/new", data={**FORM, "csrf_token": auth.csrf(), "team": "acme", "url": "x",
                                                    "max_age_seconds": "7200"}).get_data(as_text=True)
    assert "until the event is 2 h old" in typed  # the maximum age the form holds
