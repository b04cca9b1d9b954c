"""The audit log page: scoped to the teams you may see, filtered, newest first, page by page."""

from __future__ import annotations

import datetime as dt

from dashboard import audit
from dashboard.extensions import db
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
