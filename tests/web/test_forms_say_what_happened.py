"""Issue 36: the forms of a subscription's page, the tokens, quotas and sign-in say what really happened,
in the same words everywhere; a deleted subscription's page says it is deleted and offers nothing to do."""

from __future__ import annotations

import html as markup
import re

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import ApiToken, Delivery, DeliveryState
from tests.web.test_new_subscription_page import FORM

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


def _said(client, resp) -> str:
    """The page a form led to, as text (the flash included)."""
    assert resp.status_code in (302, 303), resp.status_code
    return markup.unescape(client.get(resp.headers["Location"]).get_data(as_text=True))


def test_a_deleted_subscriptions_page_says_deleted_and_offers_nothing(client, auth, producer, receiver, users):
    sub = producer.subscribe(receiver.url + "/gone")["id"]
    producer.publish()
    dead = db.session.scalar(select(Delivery).where(Delivery.subscription_id == sub))
    dead.state = DeliveryState.DEAD  # a dead letter stays dead (and readable) after the deletion
    db.session.commit()
    auth.login("owner")
    page = _said(client, client.post(f"/subscriptions/{sub}/delete", data={"csrf_token": auth.csrf(),
                                                                            "confirm": "yes"}))
    assert "Deleted: nothing more is sent to it; no deliveries were waiting." in page
    assert '<span class="state state-deleted">deleted</span>' in page and "Deleted by owner@example.com" in page
    assert "held until it is enabled" not in page and "state-disabled" not in page
    assert re.findall(rf'<form method="post" action="/subscriptions/{sub}[^"]*"', page) == []  # nothing acts on it
    assert "Incident rules" not in page and "Enable" not in page and "Rotate secret" not in page
    delivery = client.get(f"/deliveries/{dead.id}").get_data(as_text=True)
    assert "dead" in delivery and f'action="/subscriptions/{sub}/replay"' not in delivery


def test_pause_resume_disable_enable_replay_and_give_up_say_their_true_counts(client, auth, producer, receiver,
                                                                               users):
    sub = producer.subscribe(receiver.url + "/ok")["id"]
    auth.login("operator")
    at, csrf = f"/subscriptions/{sub}", auth.csrf()
    page = _said(client, client.post(f"{at}/pause", data={"csrf_token": csrf}))
    assert "Paused: no deliveries were waiting; new ones are held until you resume." in page
    assert re.search(r'class="primary">Resume</button>', page)  # not "Resume and send the 0 held"
    page = _said(client, client.post(f"{at}/resume", data={"csrf_token": csrf}))
    assert "Resumed: nothing was held; new deliveries are sent as they come." in page
    page = _said(client, client.post(f"{at}/disable", data={"csrf_token": csrf, "reason": "moving"}))
    assert "Disabled: no deliveries were waiting; new ones are held until someone enables it." in page
    assert re.search(r'class="primary">Enable</button>', page)
    producer.publish()
    page = _said(client, client.post(f"{at}/enable", data={"csrf_token": csrf}))
    assert "Enabled: 1 held delivery is on its way." in page
    page = _said(client, client.post(f"{at}/replay", data={"csrf_token": csrf}))
    assert "Nothing to replay: this subscription has no dead letters." in page
    page = _said(client, client.post(f"{at}/give-up", data={"csrf_token": csrf}))
    assert "Nothing to give up on: no delivery was scheduled for a retry." in page


def test_an_edit_says_what_changed_in_words_with_its_values(client, auth, producer, receiver, users):
    sub = producer.subscribe(receiver.url + "/ok")["id"]
    auth.login("owner")
    form = {**FORM, "csrf_token": auth.csrf(), "url": receiver.url + "/ok", "event_types": "*",
            "description": "", "retry_policy": "exponential", "max_age_seconds": "86400", "connect_timeout": "5",
            "attempt_timeout": "10", "rate_limit_per_s": "", "max_in_flight": ""}
    page = _said(client, client.post(f"/subscriptions/{sub}/edit", data={**form, "retry_policy": "quick-then-sweep",
                                                                         "max_age_seconds": "3600"}))
    assert "Saved: retry policy quick-then-sweep (was exponential); maximum event age 1 h (was 24 h)." in page
    page = _said(client, client.post(f"/subscriptions/{sub}/edit", data={**form, "retry_policy": "quick-then-sweep",
                                                                         "max_age_seconds": "3600"}))
    assert "Nothing changed: the form was as saved." in page


def test_quotas_and_a_second_revoke_say_what_happened(client, auth, producer, users):
    auth.login("admin")
    csrf = auth.csrf()
    page = _said(client, client.post(f"/quotas/{producer.team.id}", data={"csrf_token": csrf, "subscriptions": "50"}))
    assert "Quotas of acme: subscriptions 50 (was the default, 100)." in page
    token = db.session.scalar(select(ApiToken).where(ApiToken.team_id == producer.team.id))
    _said(client, client.post(f"/tokens/{token.id}/revoke", data={"csrf_token": csrf}))
    page = _said(client, client.post(f"/tokens/{token.id}/revoke", data={"csrf_token": csrf}))
    assert f"{token.display_prefix}… was already revoked: nothing changed." in page


def test_one_word_for_each_thing_in_the_nav_headings_and_sign_in(client, auth, users):
    page = markup.unescape(client.get(client.get("/tokens").headers["Location"]).get_data(as_text=True))
    assert "Sign in to see this page." in page and "log in" not in page.lower()
    auth.login("admin")
    overview = client.get("/").get_data(as_text=True)
    assert ">New subscription</a>" in overview and ">Notification sinks</a>" in overview
    assert "<h1>Notification sinks</h1>" in client.get("/sinks").get_data(as_text=True)
    new = client.get("/subscriptions/new").get_data(as_text=True)
    assert "<h1>New subscription</h1>" in new and ">Create subscription</button>" in new and "endpoint<" not in new
