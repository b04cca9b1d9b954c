"""The payload filter on the dashboard's and the portal's forms (issue 39): set on creation, changed and cleared on
edit, refused in words when it is not JSON or not the language, tried on a catalog type's example body, and named
in the contract. The language itself and ingest are tested in tests/subscriptions/test_filters.py and
tests/ingest/test_filtered_ingest.py."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Subscription

from tests.conftest import _csrf_from
from tests.support.portal import open_portal
from tests.web.test_new_subscription_page import FORM

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]  # page logic
EU = {"data.region": "eu"}
SCHEMA = {"type": "object", "properties": {"region": {"type": "string", "examples": ["eu"]},
                                           "amount": {"type": "integer", "examples": [250]}}}


@pytest.fixture
def declared(producer):
    resp = producer.post("/api/v1/event-types", {"name": "invoice.paid", "version": 1, "schema": SCHEMA})
    assert resp.status_code in (200, 201), resp.get_json()


def create(client, csrf, receiver, **fields):
    return client.post("/subscriptions/new", data={**FORM, "csrf_token": csrf, "team": "acme",
                                                   "url": receiver.url + "/ok", "event_types": "*", **fields})


def test_a_filter_set_on_creation_is_stored_and_named_in_the_contract(client, auth, producer, receiver, users):
    auth.login("owner")
    resp = create(client, auth.csrf(), receiver, filter=json.dumps(EU))
    assert resp.status_code == 303, resp.get_data(as_text=True)[:500]
    sub = db.session.scalar(select(Subscription))
    assert sub.filter == EU
    contract = client.get(f"/subscriptions/{sub.id}/contract").get_data(as_text=True)
    assert "Only events that match this filter are sent" in contract and "data.region" in contract
    edit = client.get(f"/subscriptions/{sub.id}/edit").get_data(as_text=True)
    assert "data.region" in edit  # the box shows the filter as stored


@pytest.mark.parametrize("text, status, words", [
    ('{"data.region": ', 400, "the filter is not JSON"),
    ('{"data.amount": {"$gt": [1]}}', 422, "filter.data.amount"),
])
def test_a_wrong_filter_is_refused_in_words_and_nothing_is_stored(client, auth, producer, receiver, users,
                                                                  text, status, words):
    auth.login("owner")
    resp = create(client, auth.csrf(), receiver, filter=text)
    assert resp.status_code == status
    assert words in resp.get_data(as_text=True)
    assert db.session.scalar(select(Subscription)) is None


def test_an_edit_changes_then_clears_the_filter_and_the_audit_log_says_so(client, auth, producer, receiver, users):
    sub = producer.subscribe(receiver.url + "/ok")
    auth.login("owner")
    for given, stored in ((json.dumps(EU), EU), ("", None)):
        resp = client.post(f"/subscriptions/{sub['id']}/edit",
                           data={**FORM, "csrf_token": auth.csrf(), "url": receiver.url + "/ok", "event_types": "*",
                                 "filter": given})
        assert resp.status_code in (302, 303), resp.get_data(as_text=True)[:500]
        db.session.expire_all()
        assert db.session.get(Subscription, sub["id"]).filter == stored
    edits = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "subscription.edited")).all()
    assert [e.detail["after"].get("filter") for e in edits] == [EU, None]


def test_try_it_answers_whether_the_catalog_example_would_be_sent(client, auth, producer, receiver, users, declared):
    auth.login("owner")
    page = client.get("/subscriptions/new?team=acme").get_data(as_text=True)
    assert 'name="filter_example"' in page and "Try it" in page

    def tried(text):
        resp = client.post("/subscriptions/filter-try", headers={"HX-Request": "true"},
                           data={"csrf_token": auth.csrf(), "team": "acme", "filter_example": "invoice.paid",
                                 "filter": text})
        assert resp.status_code == 200
        return resp.get_data(as_text=True)

    assert "Matches: the example invoice.paid event would be sent" in tried(json.dumps(EU))
    assert "No match" in tried('{"data.amount": {"$lt": 100}}')
    assert "No filter" in tried("")
    assert "filter.$or: " in tried('{"$or": "eu"}')


def test_try_it_is_refused_for_a_team_the_user_does_not_see(client, auth, producer, users, declared):
    auth.login("outsider")
    resp = client.post("/subscriptions/filter-try", data={"csrf_token": auth.csrf(), "team": "acme",
                                                          "filter_example": "invoice.paid", "filter": "{}"})
    assert resp.status_code == 404


def test_a_consumer_sets_a_filter_in_its_portal_and_tries_it(app, producer, receiver, declared):
    producer.put_consumer("cus_1")
    browser = app.test_client()
    open_portal(browser, producer, "cus_1")
    csrf = _csrf_from(browser.get("/portal/endpoints/new").get_data(as_text=True))
    resp = browser.post("/portal/subscriptions/filter-try",
                        data={"csrf_token": csrf, "team": "someone-else", "filter_example": "invoice.paid",
                              "filter": json.dumps(EU)})
    assert "Matches" in resp.get_data(as_text=True)  # the portal's own team's catalog, whatever the form says
    resp = browser.post("/portal/endpoints/new", data={"csrf_token": csrf, "url": receiver.url + "/hook",
                                                       "event_types": "invoice.paid", "filter": json.dumps(EU),
                                                       **{k: v for k, v in FORM.items() if k != "max_in_flight"}})
    assert resp.status_code == 303, resp.get_data(as_text=True)[:500]
    assert db.session.scalar(select(Subscription)).filter == EU
