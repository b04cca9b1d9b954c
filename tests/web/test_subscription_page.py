"""The subscription page: its week of outcomes, delivery filters, disable / enable, and its own audit entries."""

from __future__ import annotations

import datetime as dt
import re

from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Delivery, Subscription

from tests.support import pipeline


def test_disable_needs_a_reason_that_everyone_then_reads(app, client, auth, producer, receiver, users):
    sub = producer.subscribe(receiver.url + "/status/200")
    producer.publish()
    auth.login("operator")
    token = auth.csrf()
    refused = client.post(f"/subscriptions/{sub['id']}/disable", data={"csrf_token": token, "reason": "  "})
    assert refused.status_code == 400 and "reason is required" in refused.get_data(as_text=True)
    assert db.session.get(Subscription, sub["id"]).state == "active"  # nothing changed half-way

    client.post(f"/subscriptions/{sub['id']}/disable", data={"csrf_token": token, "reason": "receiver <migrating>"})
    db.session.expire_all()
    assert db.session.get(Subscription, sub["id"]).state == "disabled"
    assert db.session.scalar(select(Delivery.state)) == "held"
    # Resume does not end a disable; enable does.
    assert client.post(f"/subscriptions/{sub['id']}/resume", data={"csrf_token": token}).status_code == 409

    auth.login("member")
    html = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    assert "receiver &lt;migrating&gt;" in html and 'role="alert"' in html
    assert "<button" not in html.split("<h2 id=\"outcomes\">")[0].split("</header>")[1]  # a member gets no buttons

    auth.login("owner")
    client.post(f"/subscriptions/{sub['id']}/enable", data={"csrf_token": auth.csrf()})
    db.session.expire_all()
    assert db.session.get(Subscription, sub["id"]).state == "active"
    assert db.session.scalar(select(Delivery.state)) == "pending"
    actions = db.session.scalars(select(AuditEntry.action).where(AuditEntry.action.like("subscription.%"))
                                 .order_by(AuditEntry.id)).all()
    assert actions[-2:] == ["subscription.disabled", "subscription.enabled"]
    enabled = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "subscription.enabled"))
    assert enabled.actor == "owner@example.com" and enabled.deliveries == 1


def test_it_shows_its_outcomes_its_filters_and_its_own_audit_entries(app, client, auth, producer, receiver, users, clock):
    sub = producer.subscribe(receiver.url + "/status/500")
    other = producer.subscribe(receiver.url + "/status/200")
    producer.publish("file.updated")
    producer.publish("file.deleted")
    pipeline.deliver_due(app, clock)
    producer.post(f"/api/v1/subscriptions/{other['id']}/pause")
    auth.login("member")
    page = f"/subscriptions/{sub['id']}"

    html = client.get(page + "?window=7d").get_data(as_text=True)
    assert "Outcomes, last 7 days, per hour" in html
    failures = re.search(r'<path class="fail" d="([^"]+)"><title>Failed: 2</title>', html)
    assert failures and failures.group(1).count("M") == 1  # both failures fall in this hour's bar

    updated, deleted = '<td data-label="Event">file.updated</td>', '<td data-label="Event">file.deleted</td>'
    assert html.count(updated) == 1 and html.count(deleted) == 1
    only_deleted = client.get(page + "?type=file.deleted").get_data(as_text=True)
    assert deleted in only_deleted and updated not in only_deleted
    assert client.get(page + "?status=500").get_data(as_text=True).count("<td><a href=\"/deliveries/") == 2
    assert client.get(page + "?status=200").get_data(as_text=True).count("<td><a href=\"/deliveries/") == 0
    assert client.get(page + "?status=abc").status_code == 400

    audit_part = html.split("<h2>Audit log</h2>")[1]
    assert "subscription.created" in audit_part and "subscription.paused" not in audit_part  # only its own
    assert f"/audit?subscription={sub['id']}" in audit_part


def test_its_deliveries_filter_by_a_time_window_and_a_bad_time_is_a_400(app, client, auth, producer, receiver, users,
                                                                      clock):
    sub = producer.subscribe(receiver.url + "/status/200")
    first = clock.now()
    producer.publish("file.updated")
    clock.advance(hours=2)
    producer.publish("file.deleted")
    auth.login("member")
    page = f"/subscriptions/{sub['id']}"
    row = '<td><a href="/deliveries/'
    middle = (first + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")

    html = client.get(page + f"?from={middle}").get_data(as_text=True)
    assert html.count(row) == 1 and "<td data-label=\"Event\">file.deleted</td>" in html
    assert f'<input type="datetime-local" name="from" value="{middle}">' in html
    assert f"?state=dead&amp;from={middle}" in html  # the state links keep the window
    only_first = client.get(page + f"?to={middle}").get_data(as_text=True)
    assert only_first.count(row) == 1 and "<td data-label=\"Event\">file.updated</td>" in only_first
    assert client.get(page + f"?to={middle}&type=file.deleted").get_data(as_text=True).count(row) == 0
    # A time with a zone is read in UTC: the same instant, 5 hours ahead.
    ahead = (first + dt.timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M") + "%2B05:00"
    assert client.get(page + f"?from={ahead}").get_data(as_text=True).count(row) == 1

    for bad, said in [("?from=tuesday", "from must be an ISO 8601 time"), (f"?from={middle}&to={middle}",
                      "from must be before to"), ("?to=0001-01-01T00:00%2B14:00", "is outside years 1 to 9999 in UTC")]:
        resp = client.get(page + bad)
        assert resp.status_code == 400 and said in resp.get_data(as_text=True), bad


def test_a_pull_subscriptions_pages_name_no_url(app, client, auth, producer, users):
    sub = producer.post("/api/v1/subscriptions", {"mode": "pull", "description": "warehouse loader"}).get_json()
    producer.publish()
    delivery_id = db.session.scalar(select(Delivery.id))
    auth.login("owner")
    event_id = producer.publish()["id"]
    for path in ("/", f"/subscriptions/{sub['id']}", f"/subscriptions/{sub['id']}/contract",
                 f"/deliveries/{delivery_id}", f"/subscriptions/{sub['id']}/edit", "/dead-letters",
                 f"/events/{event_id}?team=acme"):
        resp = client.get(path)
        html = resp.get_data(as_text=True)
        assert resp.status_code == 200 and not re.search(r">\s*None\s*<|[—·←] None", html), path
        if path != "/dead-letters":  # a filter's choices, empty until something dies
            assert "pull: fetched by the receiver" in html or "Pulled by its receiver" in html, path
    page = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    assert f"/api/v1/subscriptions/{sub['id']}/pull" in page and "Receiver check" not in page
    contract = client.get(f"/subscriptions/{sub['id']}/contract").get_data(as_text=True)
    assert "Timeouts" not in contract and "whole attempt" not in contract  # no connection is made to it
    assert "leases up to 100 due ones" in contract and "Not run for a pull subscription" in contract
    terms = producer.get(f"/api/v1/subscriptions/{sub['id']}/contract").get_json()
    assert terms["pull"]["checks"] == terms["checks"] and "five requests" not in terms["checks"]
    refused = client.post(f"/subscriptions/{sub['id']}/edit", data={"csrf_token": auth.csrf(), "url": "https://x.io/",
                                                                   "event_types": "*", "retry_policy": "exponential",
                                                                   "max_age_seconds": "86400"})
    assert refused.status_code == 422 and "url: a pull subscription takes no url" in refused.get_data(as_text=True)
    assert db.session.get(Subscription, sub["id"]).url is None
