"""Post/redirect/get: every dashboard form that creates or changes something answers with a redirect,
so a reload never sends it twice (issue 36, finding 3). Its errors may answer in place: nothing changed."""

from __future__ import annotations

import re

import pytest
import redis
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import ApiToken, NotificationSink
from dashboard.web.pages import shown_once
from tests.conftest import _csrf_from
from tests.web.test_new_subscription_page import FORM

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]

# The modules whose POST routes are checked here (incidents and users have their own tests).
MODULES = {"dashboard.web.auth", *(f"dashboard.web.pages.{name}" for name in (
    "owner_tools", "subscriptions", "tokens", "sinks", "quotas", "replays", "dead_letters", "checks"))}


def test_every_form_that_creates_or_changes_answers_a_redirect(app, client, auth, producer, receiver, users):
    sub = producer.subscribe(receiver.url + "/ok")["id"]
    producer.publish()
    auth.login("admin")
    csrf = auth.csrf()
    answered = {}

    def post(endpoint, path, **data):
        resp = client.post(path, data={"csrf_token": csrf, **data})
        answered[endpoint] = resp.status_code
        return resp

    at = f"/subscriptions/{sub}"
    post("pages.new_subscription", "/subscriptions/new", **FORM, team="acme", url=receiver.url + "/new",
         event_types="*")
    post("pages.edit_subscription", f"{at}/edit", **FORM, url=receiver.url + "/ok", event_types="*")
    post("pages.rotate_secret", f"{at}/rotate-secret", grace_seconds="3600")
    post("pages.end_grace", f"{at}/end-grace")
    pulled = producer.post("/api/v1/subscriptions", {"mode": "pull"}).get_json()["id"]
    post("pages.replace_pull_key", f"/subscriptions/{pulled}/replace-pull-key")
    post("pages.send_test_event", f"{at}/test")
    post("pages.run_check", f"{at}/checks")
    post("pages.pause", f"{at}/pause", reason="repairs")
    post("pages.resume", f"{at}/resume")
    post("pages.disable", f"{at}/disable", reason="repairs")
    post("pages.enable", f"{at}/enable")
    post("pages.give_up", f"{at}/give-up")
    post("pages.replay", f"{at}/replay")
    post("pages.discard", f"{at}/discard")
    started = post("pages.replay_since", f"{at}/replays", since="2000-01-01T00:00:00Z")
    post("pages.cancel_replay", started.headers.get("Location", "/replays/none") + "/cancel")
    post("pages.replay_dead_letters", "/dead-letters/replay")
    post("pages.discard_dead_letters", "/dead-letters/discard")
    post("pages.create_token", "/tokens", team="acme", name="ci")
    token = db.session.scalar(select(ApiToken).where(ApiToken.name == "ci"))
    post("pages.revoke_token", f"/tokens/{token.id}/revoke")
    post("pages.add_sink", "/sinks", name="on-call", kind="json", url=receiver.url + "/sink")
    sink = db.session.scalar(select(NotificationSink).where(NotificationSink.name == "on-call"))
    post("pages.change_sink", f"/sinks/{sink.id}/edit", name="on-call team")
    post("pages.test_sink", f"/sinks/{sink.id}/test")
    post("pages.remove_sink", f"/sinks/{sink.id}/remove")
    post("pages.set_quotas", f"/quotas/{producer.team.id}", subscriptions="50")
    post("pages.delete_subscription", f"{at}/delete", confirm="yes")
    post("auth.change_password", "/account/password", current="pw-admin", new="a new long passphrase 36",
         repeat="a new long passphrase 36")
    csrf = _csrf_from(client.get("/account/password").get_data(as_text=True))
    post("auth.logout", "/logout")
    csrf = _csrf_from(client.get("/login").get_data(as_text=True))
    post("auth.login", "/login", email="owner@example.com", password="pw-owner")

    assert {endpoint: status for endpoint, status in answered.items() if status not in (302, 303)} == {}
    routes = {rule.endpoint for rule in app.url_map.iter_rules()
              if "POST" in rule.methods and app.view_functions[rule.endpoint].__module__ in MODULES}
    # A portal route that is its dashboard twin's view is answered by the same code; the portal's own new-endpoint
    # form is checked in tests/portal/test_portal_endpoints.py.
    routes = {endpoint for endpoint in routes if not endpoint.startswith("portal.")
              or app.view_functions.get("pages." + endpoint.removeprefix("portal.")) is not app.view_functions[endpoint]}
    routes -= {"portal.new_endpoint"}
    # Trying a filter changes nothing: it answers a fragment under the filter box (tests/web/test_filter_forms.py).
    routes -= {"pages.try_filter", "portal.try_filter"}
    assert routes - set(answered) == set(), "a new form: add it here"


def test_while_redis_is_away_the_secret_is_shown_in_the_answer_rather_than_lost(client, auth, receiver, users,
                                                                                   monkeypatch):
    def away():
        raise redis.ConnectionError("Redis is away")

    monkeypatch.setattr(shown_once, "connect", away)
    auth.login("owner")
    resp = client.post("/tokens", data={"csrf_token": auth.csrf(), "name": "during an outage"})
    assert resp.status_code == 200 and resp.headers["Cache-Control"] == "no-store"
    [plaintext] = re.findall(r'id="one-time-secret">([^<]+)<', resp.get_data(as_text=True))
    token = db.session.scalar(select(ApiToken).where(ApiToken.name == "during an outage"))
    assert token.token_sha256 == ApiToken.digest(plaintext)
