"""A consumer manages its own endpoints in the portal with the dashboard's owner tools: creates one (the SSRF rules,
the catalog and the quota apply as on the dashboard and the API; the secret is shown once), edits, deletes, rotates
its secret with a grace and sends a test event to a real receiver. Another consumer's endpoint is a 404; every
change is audited as portal:<uid>."""

from __future__ import annotations

import json
import re

import pytest
from promesa_receiver.signing import CONSUMER_HEADER
from sqlalchemy import func, select

from dashboard.core import crypto
from dashboard.core.extensions import db
from dashboard.ingest import quotas
from dashboard.models import AuditEntry, Consumer, Delivery, Subscription

from tests.support.browser import DESKTOP, PHONE, assert_fits
from tests.support.pipeline import deliver_due
from tests.support.portal import link_path, open_portal
from tests.web.test_browser import assert_no_csp_violations, browser_page, live_url  # noqa: F401 (fixtures)

# The owner tools' forms, as the portal shows them: their SQL is the core tests', run there on both databases.
ON_SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

FORM = {"description": "billing", "retry_policy": "exponential", "signature_scheme": "promesa",
        "connect_timeout": "2", "attempt_timeout": "4", "max_age_seconds": "3600", "rate_limit_per_s": ""}
INVOICE_SCHEMA = {"type": "object", "required": ["resource_id", "amount"],
                  "properties": {"resource_id": {"type": "string", "minLength": 3},
                                 "amount": {"type": "integer", "minimum": 100},
                                 "paid_at": {"type": "string", "format": "date-time"},
                                 "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}}},
                  "$defs": {"line": {"type": "object", "properties": {"sku": {"enum": ["basic", "pro"]}}}}}


class Portal:
    """A browser signed in to one consumer's portal."""

    def __init__(self, app, producer, uid):
        self.client = app.test_client()
        open_portal(self.client, producer, uid)
        self.uid = uid

    def page(self, path):
        resp = self.client.get(path)
        assert resp.status_code == 200, (path, resp.status_code)
        return resp.get_data(as_text=True)

    def csrf(self):
        return re.search(r'name="csrf_token" value="([^"]+)"', self.page("/portal/")).group(1)

    def post(self, path, **data):
        headers = data.pop("headers", {})
        return self.client.post(path, data={"csrf_token": self.csrf(), **data}, headers=headers)


@pytest.fixture
def portal(app, producer):
    producer.put_consumer("cus_1", name="Initech")
    producer.put_consumer("cus_2", name="Globex")
    return Portal(app, producer, "cus_1")


def declare(producer, name, schema=None):
    resp = producer.post("/api/v1/event-types", {"name": name, "version": 1, "schema": schema or {"type": "object"}})
    assert resp.status_code in (200, 201), resp.get_json()


def subscriptions(**where):
    return db.session.scalars(select(Subscription).filter_by(**where)).all()


def audited(action):
    return [(e.actor_kind, e.actor) for e in db.session.scalars(select(AuditEntry).where(AuditEntry.action == action))]


@ON_SQLITE
def test_a_consumer_creates_an_endpoint_from_the_catalog_and_sees_its_secret_once(portal, producer, receiver):
    declare(producer, "invoice.paid", INVOICE_SCHEMA)
    declare(producer, "invoice.voided")
    home = portal.page("/portal/")
    assert home.count('href="/portal/endpoints/new"') == 2  # the header's nav and the home's button

    form = portal.page("/portal/endpoints/new")
    assert 'value="invoice.paid"' in form and 'value="invoice.voided"' in form
    # each type with its schema and an example body that meets it
    assert "&#34;minLength&#34;: 3" in form or "&quot;minLength&quot;: 3" in form
    [example] = [json.loads(_unescape(body)) for body in re.findall(r'<pre class="code example-body">([^<]+)</pre>',
                                                                      form) if "invoice.paid" in _unescape(body)]
    assert example["type"] == "invoice.paid" and example["version"] == 1
    assert example["data"] == {"resource_id": "string", "amount": 100, "paid_at": "2026-01-01T12:00:00Z",
                               "lines": [{"sku": "basic"}]}
    assert "a sketch" not in form.split("invoice.voided")[0]  # it meets the schema: no caveat
    # the consumer is the session's: no team, no consumer, no Promesa notifications, no in-flight limit
    for dashboard_only in ('name="team"', 'name="consumer"', "promesa.incident", 'name="max_in_flight"',
                           "/api/v1/subscriptions", "@example.com", "per worker"):
        assert dashboard_only not in form, dashboard_only

    resp = portal.post("/portal/endpoints/new", **FORM, url=receiver.url + "/hook", event_types="invoice.paid")
    [sub] = subscriptions(url=receiver.url + "/hook")
    assert resp.status_code == 303 and resp.headers["Location"] == f"/portal/subscriptions/{sub.id}/created"
    consumer = db.session.scalar(select(Consumer).where(Consumer.uid == "cus_1"))
    assert (sub.consumer_id, sub.team_id, sub.event_types, sub.description) == \
        (consumer.id, producer.team.id, ["invoice.paid"], "billing")
    assert (sub.connect_timeout, sub.attempt_timeout, sub.max_age_seconds, sub.max_in_flight) == (2, 4, 3600, None)
    secret = crypto.decrypt(sub.secret_ciphertext)
    assert secret not in resp.get_data(as_text=True)

    created = portal.client.get(resp.headers["Location"])
    html = created.get_data(as_text=True)
    assert created.status_code == 200 and created.headers["Cache-Control"] == "no-store"
    assert "Endpoint created" in html and re.search(r'id="new-secret">([^<]+)<', html).group(1) == secret
    assert 'data-copy="new-secret"' in html
    assert f'action="/portal/subscriptions/{sub.id}/checks"' in html  # the check is offered, in the portal
    again = portal.page(f"/portal/subscriptions/{sub.id}/created")
    assert secret not in again and "was shown once" in again
    assert secret not in portal.page(f"/portal/subscriptions/{sub.id}")
    assert audited("subscription.created") == [("portal", "cus_1")]


def _unescape(html: str) -> str:
    return html.replace("&#34;", '"').replace("&quot;", '"').replace("&#39;", "'").replace("&amp;", "&")


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/hook", "http://169.254.169.254/latest/meta-data",
                                 "http://10.0.0.1/hook"])
@ON_SQLITE
def test_a_private_address_is_refused_in_words_a_consumer_can_act_on(app, portal, url):
    app.config["PROMESA_ALLOW_PRIVATE_TARGETS"] = False
    resp = portal.post("/portal/endpoints/new", **FORM, url=url, event_types="*")
    html = resp.get_data(as_text=True)
    assert resp.status_code == 422 and "is a private address, which is not allowed" in html
    assert "PROMESA_" not in html  # a server setting is not the consumer's to change
    assert 'value="' + url + '"' in html  # the form as typed, to correct
    assert db.session.scalar(select(func.count()).select_from(Subscription)) == 0
    assert audited("subscription.created") == []


@ON_SQLITE
def test_a_strict_team_s_consumer_picks_from_the_catalog_only(portal, producer, receiver):
    declare(producer, "invoice.paid")
    resp = producer.client.patch("/api/v1/team", json={"strict_event_types": True}, headers=producer.headers())
    assert resp.status_code == 200
    form = portal.page("/portal/endpoints/new")
    assert 'name="event_patterns"' not in form  # nothing to type on a strict team
    for outside in ({"event_types": "file.updated"}, {"event_patterns": "file.*"},
                    {"event_types": ["invoice.paid", "promesa.incident.opened"]}):
        resp = portal.post("/portal/endpoints/new", **FORM, url=receiver.url + "/hook", **outside)
        assert resp.status_code == 422 and "not in acme&#39;s catalog" in resp.get_data(as_text=True), outside
    assert subscriptions() == []
    for inside in ({"event_types": "invoice.paid"}, {"event_types": "*"}, {"event_patterns": "invoice.*"}):
        assert portal.post("/portal/endpoints/new", **FORM, url=receiver.url + "/hook", **inside).status_code == 303
    assert len(subscriptions(url=receiver.url + "/hook")) == 3


@ON_SQLITE
def test_the_consumer_s_own_quota_holds_and_is_not_shown(portal, producer, receiver):
    quotas.set_override(producer.team, "subscriptions_per_consumer", 1, actor=("system", "test"))
    producer.subscribe(receiver.url + "/other", consumer="cus_2")  # another consumer's: not counted
    producer.subscribe(receiver.url + "/team")  # the team's own: not counted
    assert portal.post("/portal/endpoints/new", **FORM, url=receiver.url + "/a", event_types="*").status_code == 303
    resp = portal.post("/portal/endpoints/new", **FORM, url=receiver.url + "/b", event_types="*")
    html = resp.get_data(as_text=True)
    assert resp.status_code == 409 and "as many endpoints as you may: delete one" in html
    assert "quota" not in html and "admin" not in html
    assert subscriptions(url=receiver.url + "/b") == []


@ON_SQLITE
def test_a_consumer_edits_its_own_endpoint_and_no_other(portal, producer, receiver):
    declare(producer, "invoice.paid")
    own = producer.subscribe(receiver.url + "/old", consumer="cus_1", max_in_flight=3, event_types=["invoice.paid"])
    other = producer.subscribe(receiver.url + "/other", consumer="cus_2")
    team = producer.subscribe(receiver.url + "/team")
    page = portal.page(f"/portal/subscriptions/{own['id']}")
    assert "Endpoint settings" in page and f'href="/portal/subscriptions/{own["id"]}/edit"' in page
    assert "in flight" not in page

    form = portal.page(f"/portal/subscriptions/{own['id']}/edit")
    assert "Edit endpoint" in form and 'name="max_in_flight"' not in form
    assert re.search(r'value="invoice.paid" checked', form)
    resp = portal.post(f"/portal/subscriptions/{own['id']}/edit", **{**FORM, "retry_policy": "quick-then-sweep"},
                       url=receiver.url + "/new", event_types="*")
    assert resp.status_code == 302 and resp.headers["Location"] == f"/portal/subscriptions/{own['id']}"
    sub = db.session.get(Subscription, own["id"])
    db.session.refresh(sub)
    assert (sub.url, sub.event_types, sub.retry_policy, sub.description) == \
        (receiver.url + "/new", ["*"], "quick-then-sweep", "billing")
    assert sub.max_in_flight == 3  # the producer's setting, not on the consumer's form: kept
    assert "Saved: endpoint URL" in portal.page(resp.headers["Location"])
    assert audited("subscription.edited") == [("portal", "cus_1")]

    for not_its_own in (other["id"], team["id"], "sub_unknown"):
        assert portal.client.get(f"/portal/subscriptions/{not_its_own}/edit").status_code == 404
        resp = portal.post(f"/portal/subscriptions/{not_its_own}/edit", **FORM, url=receiver.url + "/x",
                           event_types="*")
        assert resp.status_code == 404
        for action in ("rotate-secret", "end-grace", "delete", "test"):
            assert portal.post(f"/portal/subscriptions/{not_its_own}/{action}", confirm="yes").status_code == 404
    assert subscriptions(url=receiver.url + "/x") == [] and db.session.get(Subscription, other["id"]).deleted_at is None


@ON_SQLITE
def test_a_consumer_deletes_its_endpoint_after_confirming(portal, producer, receiver):
    own = producer.subscribe(receiver.url + "/ok", consumer="cus_1")
    page = portal.page(f"/portal/subscriptions/{own['id']}")
    assert 'data-confirm="Delete this endpoint? Nothing more will be sent to it."' in page
    resp = portal.post(f"/portal/subscriptions/{own['id']}/delete")
    assert resp.status_code == 302 and db.session.get(Subscription, own["id"]).deleted_at is None  # not ticked
    resp = portal.post(f"/portal/subscriptions/{own['id']}/delete", confirm="yes")
    assert resp.status_code == 302 and resp.headers["Location"] == "/portal/"
    db.session.expire_all()
    assert db.session.get(Subscription, own["id"]).deleted_at is not None
    home = portal.page("/portal/")
    assert "Deleted: nothing more is sent to it" in home and receiver.url + "/ok" not in home.split("Dead letters")[0]
    assert audited("subscription.deleted") == [("portal", "cus_1")]


@ON_SQLITE
def test_a_consumer_rotates_its_secret_with_a_grace_then_ends_the_grace(portal, producer, receiver):
    own = producer.subscribe(receiver.url + "/ok", consumer="cus_1")
    resp = portal.post(f"/portal/subscriptions/{own['id']}/rotate-secret", grace_seconds="3600")
    assert resp.status_code == 303 and resp.headers["Location"] == f"/portal/subscriptions/{own['id']}/rotated"
    sub = db.session.get(Subscription, own["id"])
    db.session.refresh(sub)
    new = crypto.decrypt(sub.secret_ciphertext)
    assert crypto.decrypt(sub.previous_secret_ciphertext) == own["secret"]
    shown = portal.client.get(resp.headers["Location"])
    html = shown.get_data(as_text=True)
    assert shown.headers["Cache-Control"] == "no-store" and new in html and 'data-copy="new-secret"' in html
    assert "previous secret keeps signing until" in html and own["secret"] not in html
    again = portal.page(f"/portal/subscriptions/{own['id']}/rotated")
    assert new not in again and "was shown once" in again
    assert "Signing with two secrets" in portal.page(f"/portal/subscriptions/{own['id']}")

    resp = portal.post(f"/portal/subscriptions/{own['id']}/end-grace")
    assert resp.status_code == 302 and resp.headers["Location"] == f"/portal/subscriptions/{own['id']}"
    assert "Signing with one secret" in portal.page(f"/portal/subscriptions/{own['id']}")
    db.session.refresh(sub)
    assert sub.previous_secret_ciphertext is None
    assert audited("subscription.secret_rotated") == [("portal", "cus_1")]


@ON_SQLITE
def test_a_test_event_reaches_the_consumer_s_receiver(app, portal, producer, receiver, clock):
    own = producer.subscribe(receiver.url + "/ok", consumer="cus_1")
    sent = portal.post(f"/portal/subscriptions/{own['id']}/test", headers={"HX-Request": "true"})
    html = sent.get_data(as_text=True)
    delivery = db.session.scalar(select(Delivery))
    poll = f"/portal/subscriptions/{own['id']}/test/{delivery.id}"
    assert sent.status_code == 200 and f'hx-get="{poll}"' in html
    deliver_due(app, clock)
    [got] = receiver.requests
    assert got.path == "/ok" and got.headers["X-Event-Type"] == "promesa.test"
    assert got.headers[CONSUMER_HEADER] == "cus_1"
    answered = portal.client.get(poll, headers={"HX-Request": "true"}).get_data(as_text=True)
    assert "HTTP 200" in answered and f'href="/portal/deliveries/{delivery.id}"' in answered
    assert audited("subscription.test_sent") == [("portal", "cus_1")]


@ON_SQLITE
def test_every_portal_form_of_the_owner_tools_answers_a_redirect(app, portal, producer, receiver):
    own = producer.subscribe(receiver.url + "/ok", consumer="cus_1")["id"]
    pulled = producer.post("/api/v1/subscriptions", {"mode": "pull", "consumer": "cus_1"}).get_json()["id"]
    at = f"/portal/subscriptions/{own}"
    answered = {
        "portal.new_endpoint": portal.post("/portal/endpoints/new", **FORM, url=receiver.url + "/n", event_types="*"),
        "portal.edit_subscription": portal.post(f"{at}/edit", **FORM, url=receiver.url + "/ok", event_types="*"),
        "portal.rotate_secret": portal.post(f"{at}/rotate-secret", grace_seconds="3600"),
        "portal.end_grace": portal.post(f"{at}/end-grace"),
        "portal.send_test_event": portal.post(f"{at}/test"),
        "portal.replace_pull_key": portal.post(f"/portal/subscriptions/{pulled}/replace-pull-key"),
        "portal.delete_subscription": portal.post(f"{at}/delete", confirm="yes"),
    }
    assert {name: resp.status_code for name, resp in answered.items() if resp.status_code not in (302, 303)} == {}
    owner_tools = {rule.endpoint for rule in app.url_map.iter_rules() if rule.endpoint.startswith("portal.")
                   and "POST" in rule.methods
                   and app.view_functions[rule.endpoint].__module__ == "dashboard.web.pages.owner_tools"}
    # Trying a filter changes nothing (it answers a fragment): tests/web/test_filter_forms.py.
    assert owner_tools - {"portal.try_filter"} == set(answered)


@pytest.mark.parametrize("schema", [
    INVOICE_SCHEMA,
    {"type": "object", "properties": {"n": {"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.25},
                                      "k": {"type": ["null", "integer"], "maximum": -5},
                                      "s": {"type": "string", "minLength": 9, "maxLength": 9},
                                      "t": {"type": "array", "prefixItems": [{"const": "a"}], "minItems": 1}}},
    {"oneOf": [{"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}}}, {"type": "null"}]},
    {"allOf": [{"properties": {"a": {"type": "string"}}}, {"properties": {"b": {"type": "boolean"}}}]},
    # recursion through a definition and through the root: each $ref is followed once, then left out
    {"$defs": {"node": {"type": "object", "properties": {"children": {"type": "array",
                                                                      "items": {"$ref": "#/$defs/node"}}}}},
     "$ref": "#/$defs/node"},
    {"type": "object", "properties": {"parent": {"$ref": "#"}, "id": {"type": "integer", "examples": [42]}}},
])
def test_an_example_meets_its_schema_and_is_the_same_every_time(schema):
    import jsonschema

    from dashboard.subscriptions.examples import example_data

    data = example_data(schema)
    jsonschema.validate(data, schema)
    assert example_data(schema) == data


@ON_SQLITE
@pytest.mark.slow
def test_in_a_browser_a_consumer_creates_copies_rotates_and_deletes_at_both_widths(
        app, producer, receiver, live_url, browser_page):  # noqa: F811
    from playwright.sync_api import expect

    producer.put_consumer("cus_1", name="Initech")
    declare(producer, "invoice.paid", INVOICE_SCHEMA)
    page = browser_page
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_url)
    page.set_viewport_size(DESKTOP)
    page.goto(live_url + link_path(producer, "cus_1"))

    page.set_viewport_size(PHONE)  # the portal's two links stay on screen on a phone
    page.click("nav >> text=New endpoint")
    page.set_viewport_size(DESKTOP)
    assert page.locator("input[name=event_types][value='*']").is_checked()
    page.uncheck("input[name=event_types][value='*']")
    page.check("input[name=event_types][value='invoice.paid']")
    page.click("summary:has-text('Schema and example')")
    example = json.loads(page.locator("pre.example-body").first.inner_text())
    assert example["type"] == "invoice.paid" and example["data"]["amount"] == 100
    _fits_at_both_widths(page)
    page.fill("input[name=url]", receiver.url + "/hook")
    page.click("button:text('Create endpoint')")
    page.wait_for_url("**/portal/subscriptions/*/created")
    sub = db.session.scalar(select(Subscription).where(Subscription.url == receiver.url + "/hook"))
    page.click("button[data-copy=new-secret]")
    expect(page.locator("button[data-copy=new-secret]")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == crypto.decrypt(sub.secret_ciphertext)
    _fits_at_both_widths(page)

    page.click("text=Open the endpoint")
    page.wait_for_url(f"**/portal/subscriptions/{sub.id}")
    page.click("button:text('Rotate secret')")  # htmx: the new secret in place, once
    expect(page.locator("#new-secret")).to_be_visible()
    db.session.expire_all()
    assert page.locator("#new-secret").inner_text().strip() == crypto.decrypt(
        db.session.get(Subscription, sub.id).secret_ciphertext)
    assert page.dialogs[-1].startswith("Rotate the signing secret?")
    _fits_at_both_widths(page)

    page.click("summary:text('Delete…')")
    page.check("input[name=confirm]")
    page.click("button:text('Delete this endpoint')")
    page.wait_for_url(f"{live_url}/portal/")
    assert page.dialogs[-1] == "Delete this endpoint? Nothing more will be sent to it."
    assert "Deleted: nothing more is sent to it" in page.locator(".flash").inner_text()
    _fits_at_both_widths(page)
    assert_no_csp_violations(page)


def _fits_at_both_widths(page) -> None:
    for size in (DESKTOP, PHONE):
        page.set_viewport_size(size)
        assert_fits(page)
    page.set_viewport_size(DESKTOP)
