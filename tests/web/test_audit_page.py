"""The audit log page: scoped to the teams you may see, filtered, newest first, page by page."""

from __future__ import annotations

import datetime as dt

from dashboard import audit
from dashboard.core.extensions import db
from dashboard.models import AuditEntry



def _entry(at, action="subscription.paused", team_id=None, actor="someone@example.com", subscription_id=None):
    db.session.add(AuditEntry(**audit.entry_values(action, at=at, actor=("user", actor), team_id=team_id,
                                                   subscription_id=subscription_id)))


def test_it_scopes_filters_and_pages(client, auth, users, clock):
    acme, other = users["owner"].team_id, users["outsider"].team_id
    start = clock.now()
    for i in range(60):
        _entry(start + dt.timedelta(minutes=i), team_id=acme, subscription_id="sub_acme", actor=f"a{i % 2}@example.com")
    _entry(start, "token.created", team_id=other, subscription_id="sub_other")
    _entry(start, "user.created")  # no team: global readers only
    db.session.commit()

    auth.login("owner")
    html = client.get("/audit").get_data(as_text=True)
    assert "sub_other" not in html and "user.created" not in html
    assert html.count("sub_acme</code>") == 50  # the first page, newest first
    assert (start + dt.timedelta(minutes=59)).strftime("%H:%M") in html.split("</tr>")[1]
    older = conftest_href(html, "Older")
    page2 = client.get(older).get_data(as_text=True)
    assert page2.count("sub_acme</code>") == 10 and "Older" not in page2
    assert client.get("/audit?team=other").status_code == 404

    only_a1 = client.get("/audit?actor=A1@example.com").get_data(as_text=True)
    assert only_a1.count("sub_acme</code>") == 30
    window = client.get("/audit?since=" + (start + dt.timedelta(minutes=50)).strftime("%Y-%m-%dT%H:%M")
                        ).get_data(as_text=True)
    assert window.count("sub_acme</code>") == 10
    assert client.get("/audit?since=yesterday").status_code == 400

    auth.login("oncall")
    everything = client.get("/audit?action=user.created").get_data(as_text=True)
    assert "user.created" in everything and "sub_acme" not in everything
    assert "sub_other" in client.get("/audit?team=other").get_data(as_text=True)


def conftest_href(html: str, text: str) -> str:
    import html as html_lib
    import re

    match = re.search(r'<a href="([^"]+)">' + text, html)
    assert match, f"no {text} link"
    return html_lib.unescape(match.group(1))


def test_a_time_filter_with_an_offset_is_converted_to_utc(client, auth, users, clock):
    start = clock.now()  # naive UTC, as stored
    _entry(start, team_id=users["owner"].team_id, subscription_id="sub_acme")
    db.session.commit()
    auth.login("owner")

    def shown(**window) -> bool:
        query = "&".join(f"{k}={v.replace('+', '%2B')}" for k, v in window.items())
        return "sub_acme</code>" in client.get("/audit?" + query).get_data(as_text=True)

    # 30 minutes before the entry, written two hours ahead of UTC: the entry is inside the window.
    since = (start - dt.timedelta(minutes=30) + dt.timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M") + "+02:00"
    assert shown(since=since)
    # 30 minutes after the entry, two hours behind UTC: the entry is before it.
    until = (start + dt.timedelta(minutes=30) - dt.timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M") + "-02:00"
    assert shown(until=until)
    until_before = (start - dt.timedelta(minutes=30) + dt.timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M") + "+02:00"
    assert not shown(until=until_before)


def test_an_edit_shows_each_changed_fields_old_and_new_value(client, auth, producer, receiver, users):
    sub = producer.subscribe(receiver.url + "/old", event_types=["file.*"])
    auth.login("owner")
    form = {"csrf_token": auth.csrf(), "url": receiver.url + "/new", "description": "", "event_types": "file.*",
            "retry_policy": "exponential", "connect_timeout": "5", "attempt_timeout": "10",
            "max_age_seconds": "86400"}
    assert client.post(f"/subscriptions/{sub['id']}/edit", data=form).status_code == 302
    html = client.get("/audit?action=subscription.edited").get_data(as_text=True)
    assert f"<dt>url</dt><dd><del>{receiver.url}/old</del> → <ins>{receiver.url}/new</ins></dd>" in html
    assert "before: url" not in html  # the keys alone said nothing


def test_secrets_are_hidden_and_a_sinks_address_is_masked(client, auth, users, clock):
    from dashboard.operations import notifications

    sink_team = notifications.system_team()
    db.session.add(AuditEntry(**audit.entry_values(
        "subscription.edited", at=clock.now(), actor=("user", "admin@example.com"), team_id=sink_team.id,
        detail={"before": {"url": "https://hooks.slack.com/services/T0/B0/old-credential"},
                "after": {"url": "https://hooks.slack.com/services/T0/B0/new-credential"}})))
    db.session.add(AuditEntry(**audit.entry_values(
        "subscription.secret_rotated", at=clock.now(), actor=("user", "admin@example.com"),
        detail={"secret": "whsec_do-not-show", "grace_seconds": 3600})))
    db.session.commit()
    auth.login("admin")
    html = client.get("/audit").get_data(as_text=True)
    assert "credential" not in html and "https://hooks.slack.com/services/…" in html
    assert "whsec_do-not-show" not in html and "secret: (hidden)" in html and "grace seconds: 3600" in html
