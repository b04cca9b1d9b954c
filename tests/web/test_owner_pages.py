"""The owner tools on the subscription page: rotate, end grace, edit, delete, send a test event.
Who may use them is checked for every role in tests/test_access_matrix.py; here, what they do."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dashboard.core import crypto
from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Subscription


pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]  # page logic, not database logic


def page(client, sub_id) -> str:
    return client.get(f"/subscriptions/{sub_id}").get_data(as_text=True)


def test_it_rotates_from_the_page_and_shows_the_secret_once(client, auth, producer, receiver, users):
    sub = producer.subscribe(receiver.url + "/ok")
    auth.login("owner")
    assert "Signing with one secret" in page(client, sub["id"])
    resp = client.post(f"/subscriptions/{sub['id']}/rotate-secret", headers={"HX-Request": "true"},
                       data={"csrf_token": auth.csrf(), "grace_seconds": "3600"})
    assert resp.status_code == 200 and resp.headers["Cache-Control"] == "no-store"
    stored = db.session.get(Subscription, sub["id"])
    new = crypto.decrypt(stored.secret_ciphertext)
    html = resp.get_data(as_text=True)
    assert new in html and "<html" not in html  # the htmx partial, with the secret
    assert crypto.decrypt(stored.previous_secret_ciphertext) == sub["secret"]
    again = page(client, sub["id"])
    assert new not in again and sub["secret"] not in again  # reloading does not show it again
    assert "Signing with two secrets: the newest, and the previous one until" in again
    contract = client.get(f"/subscriptions/{sub['id']}/contract").get_data(as_text=True)
    assert "Right now two secrets sign" in contract and new not in contract

    client.post(f"/subscriptions/{sub['id']}/end-grace", data={"csrf_token": auth.csrf()})
    assert "Signing with one secret" in page(client, sub["id"])
    [rotated] = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "subscription.secret_rotated"))
    assert rotated.actor == "owner@example.com" and new not in str(rotated.detail)


def test_without_htmx_the_rotation_leads_to_a_page_of_its_own_shown_once(client, auth, producer, receiver, users):
    sub = producer.subscribe(receiver.url + "/ok")
    auth.login("admin")
    resp = client.post(f"/subscriptions/{sub['id']}/rotate-secret", data={"csrf_token": auth.csrf()})
    new = crypto.decrypt(db.session.get(Subscription, sub["id"]).secret_ciphertext)
    assert resp.status_code == 303 and resp.headers["Location"] == f"/subscriptions/{sub['id']}/rotated"
    resp = client.get(resp.headers["Location"])
    html = resp.get_data(as_text=True)
    assert resp.status_code == 200 and "<html" in html and new in html and resp.headers["Cache-Control"] == "no-store"
    assert "previous secret keeps signing until" in html  # the default grace: 24 h
    again = client.get(f"/subscriptions/{sub['id']}/rotated").get_data(as_text=True)  # a reload rotates nothing
    assert new not in again and "was shown once" in again
    db.session.expire_all()
    assert crypto.decrypt(db.session.get(Subscription, sub["id"]).secret_ciphertext) == new


@pytest.mark.parametrize("role", ["operator", "member", "oncall"])
def test_only_owners_and_admins_see_the_owner_buttons(client, auth, producer, receiver, users, role):
    sub = producer.subscribe(receiver.url + "/ok")
    auth.login(role)
    html = page(client, sub["id"])
    assert "Signing with one secret" in html  # which secrets sign is for everyone who sees the page
    assert "Rotate secret" not in html and "Send test event" not in html and "Delete this subscription" not in html
