"""A browser refused, lost or sent the wrong way gets a dashboard page (the nav, what happened, why, a way
back); the API keeps its JSON errors."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


def _page(resp, status: int) -> str:
    assert resp.status_code == status
    page = resp.get_data(as_text=True)
    assert 'id="main-nav"' in page and "← Back</a>" in page, page[:300]
    return page


def test_browser_errors_are_dashboard_pages_that_say_why(client, auth, users, producer, receiver):
    sub = producer.subscribe(receiver.url + "/status/200")
    auth.login("member")
    page = _page(client.get("/users", headers={"Referer": "http://localhost/audit"}), 403)
    assert "signed in as member@example.com, member of acme." in page
    assert "Your role may not manage users: admins may." in page and '<a href="/audit">← Back</a>' in page
    assert "<dt>admin</dt>" in page  # what each role may do, so the person sees which one they would need
    pause = client.post(f"/subscriptions/{sub['id']}/pause", data={"csrf_token": auth.csrf()})
    assert "may not repair this subscription (pause, resume" in _page(pause, 403)
    assert "operators and admins, and owners of its team may." in pause.get_data(as_text=True)

    assert "There is no page at <code>/no/such/page</code>" in _page(client.get("/no/such/page"), 404)
    wrong_method = client.get(f"/subscriptions/{sub['id']}/pause")
    assert "does not take a GET" in _page(wrong_method, 405) and "POST" in wrong_method.headers["Allow"]
    stale = client.post(f"/subscriptions/{sub['id']}/pause", data={"csrf_token": "stale"})
    assert "The form was not accepted" in _page(stale, 400) and "Nothing was changed" in stale.get_data(as_text=True)

    api = client.get("/api/v1/no-such-thing", headers={"Authorization": f"Bearer {producer.token}"})
    assert api.status_code == 404 and api.get_json() == {"error": "no such resource"}
