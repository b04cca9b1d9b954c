"""A team's consumer portal settings: the origins that may frame it, its accent colour and its logo. Changed with the
team's token (GET/PUT /api/v1/portal-settings) or on the consumers page by the team's owners and admins; read there
by everyone else who sees the team. Every value is checked before any is stored, and every change is audited."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Team

from tests.conftest import _csrf_from

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]

NONE_SET = {"frame_ancestors": [], "accent_color": None, "logo_url": None}
GOOD = {"frame_ancestors": ["https://app.example.com", "http://localhost:8080"], "accent_color": "#0B5FFF",
        "logo_url": "https://cdn.example.com/logo.svg"}


def put(producer, body):
    return producer.client.put("/api/v1/portal-settings", json=body, headers=producer.headers())


def stored(producer) -> dict:
    db.session.expire_all()
    team = db.session.get(Team, producer.team.id)
    return {"frame_ancestors": team.portal_frame_ancestors or [], "accent_color": team.portal_accent,
            "logo_url": team.portal_logo_url}


def changes():
    return db.session.scalars(select(AuditEntry).where(AuditEntry.action == "portal.settings_changed")
                              .order_by(AuditEntry.id)).all()


# -- the API ----------------------------------------------------------------------------------------------------

def test_none_by_default_then_set_normalised_and_audited(producer):
    assert producer.get("/api/v1/portal-settings").get_json() == NONE_SET
    resp = put(producer, GOOD)
    assert resp.status_code == 200, resp.get_json()
    want = {"frame_ancestors": ["http://localhost:8080", "https://app.example.com"], "accent_color": "#0b5fff",
            "logo_url": "https://cdn.example.com/logo.svg"}
    assert resp.get_json() == want and producer.get("/api/v1/portal-settings").get_json() == want
    [entry] = changes()
    assert entry.actor_kind == "token" and entry.team_id == producer.team.id
    assert entry.detail == {"frame_ancestors": want["frame_ancestors"], "accent": "#0b5fff",
                            "logo_url": "https://cdn.example.com/logo.svg"}


def test_fields_not_given_keep_their_value_and_null_or_empty_clears(producer):
    put(producer, GOOD)
    resp = put(producer, {"accent_color": "#112233"})
    assert resp.get_json()["frame_ancestors"] == ["http://localhost:8080", "https://app.example.com"]
    assert resp.get_json()["logo_url"] == GOOD["logo_url"] and resp.get_json()["accent_color"] == "#112233"
    assert put(producer, {"frame_ancestors": [], "accent_color": None, "logo_url": ""}).get_json() == NONE_SET
    assert stored(producer) == NONE_SET


@pytest.mark.parametrize("field, value, words", [
    ("frame_ancestors", ["https://app.example.com/embed"], "is not an origin"),  # a path is not an origin
    ("frame_ancestors", ["app.example.com"], "is not an origin"),
    ("frame_ancestors", ["javascript://x"], "is not an origin"),
    ("frame_ancestors", ["https://app.example.com 'unsafe-inline'"], "is not an origin"),  # no second source
    ("frame_ancestors", ["https://*.example.com"], "is not an origin"),
    ("frame_ancestors", ["https://user@app.example.com"], "is not an origin"),
    ("accent_color", "red", "#rrggbb"),
    ("accent_color", "#12345", "#rrggbb"),
    ("accent_color", "#123456; } body { display: none", "#rrggbb"),  # it is written into a stylesheet
    ("accent_color", "#123456\n", "#rrggbb"),  # nothing after the colour, not even a line's end
    ("logo_url", "http://cdn.example.com/logo.svg", "https URL"),  # plain http: refused
    ("logo_url", "https://cdn.example.com/a logo.svg", "https URL"),
    ("logo_url", "data:image/svg+xml,<svg/>", "https URL"),
])
def test_a_value_refused_says_why_and_nothing_is_stored(producer, field, value, words):
    put(producer, GOOD)
    before = stored(producer)
    # The good values of the other fields are sent beside it: none of them is stored either.
    resp = put(producer, {**NONE_SET, field: value})
    assert resp.status_code == 422, resp.get_json()
    assert field in resp.get_json()["error"] and words in resp.get_json()["error"]
    assert stored(producer) == before and len(changes()) == 1


def test_at_most_ten_origins(producer):
    resp = put(producer, {"frame_ancestors": [f"https://a{n}.example.com" for n in range(11)]})
    assert resp.status_code in (400, 422) and "frame_ancestors" in resp.get_json()["error"]
    assert stored(producer) == NONE_SET


def test_one_teams_settings_are_not_anothers(client, producer):
    from tests.conftest import Producer

    other = Producer(client, team_name="other")
    put(producer, GOOD)
    assert other.get("/api/v1/portal-settings").get_json() == NONE_SET


# -- the consumers page -----------------------------------------------------------------------------------------

def page(client, team_id):
    return client.get(f"/consumers?team={team_id}")


def save(client, team_id, **fields):
    token = _csrf_from(page(client, team_id).get_data(as_text=True))
    return client.post(f"/consumers/portal-settings/{team_id}", data={"csrf_token": token, **fields})


FORM = {"frame_ancestors": "https://app.example.com\r\n\r\n  http://localhost:8080/  \r\n",
        "accent_picker": "#1d2330", "accent_color": "#0B5FFF", "logo_url": "https://cdn.example.com/logo.svg"}


def test_an_owner_sets_them_on_the_consumers_page(client, auth, users, producer):
    auth.login("owner")
    before = page(client, producer.team.id).get_data(as_text=True)
    assert 'id="portal"' in before and 'name="frame_ancestors"' in before and 'type="color"' in before
    resp = save(client, producer.team.id, **FORM)
    assert resp.status_code == 302 and resp.headers["Location"].endswith(f"/consumers?team={producer.team.id}#portal")
    assert stored(producer) == {"frame_ancestors": ["http://localhost:8080", "https://app.example.com"],
                                "accent_color": "#0b5fff", "logo_url": "https://cdn.example.com/logo.svg"}
    [entry] = changes()
    assert (entry.actor_kind, entry.actor) == ("user", "owner@example.com")
    after = page(client, producer.team.id).get_data(as_text=True)
    assert "Portal settings saved." in after
    assert "https://app.example.com\nhttp://localhost:8080" not in after  # stored sorted, one a line
    assert "http://localhost:8080\nhttps://app.example.com</textarea>" in after
    assert 'value="#0b5fff"' in after


def test_the_colour_picker_counts_when_the_text_was_left_as_it_was(client, auth, users, producer):
    auth.login("admin")
    save(client, producer.team.id, **{**FORM, "accent_color": "", "accent_picker": "#AA3300"})
    assert stored(producer)["accent_color"] == "#aa3300"
    # The text changed (emptied) beside the picker left at the stored colour: the default colours again.
    save(client, producer.team.id, **{**FORM, "accent_color": "", "accent_picker": "#aa3300"})
    assert stored(producer)["accent_color"] is None
    # Both changed: what was typed wins.
    save(client, producer.team.id, **{**FORM, "accent_color": "#00ff00", "accent_picker": "#ff0000"})
    assert stored(producer)["accent_color"] == "#00ff00"


@pytest.mark.parametrize("field, value, words", [
    ("frame_ancestors", "https://app.example.com\nnot an origin", "is not an origin"),
    ("accent_color", "blue", "#rrggbb"),
    ("logo_url", "http://cdn.example.com/logo.svg", "https URL"),
])
def test_a_refused_value_is_shown_on_the_page_with_the_form_as_sent_and_nothing_stored(
        client, auth, users, producer, field, value, words):
    auth.login("owner")
    resp = save(client, producer.team.id, **{**FORM, field: value})
    assert resp.status_code == 422
    html = resp.get_data(as_text=True)
    assert words in html and "Nothing was changed." in html
    assert f'value="{value}"' in html if field != "frame_ancestors" else "\nnot an origin</textarea>" in html
    assert stored(producer) == NONE_SET and changes() == []


def test_others_read_them_and_may_not_change_them(client, auth, users, producer):
    auth.login("owner")
    save(client, producer.team.id, **FORM)
    for role in ("member", "operator", "oncall"):
        auth.login(role)
        html = page(client, producer.team.id).get_data(as_text=True)
        assert 'name="frame_ancestors"' not in html and "https://app.example.com" in html and "#0b5fff" in html
        assert "The team's owners and admins change these." in html
        resp = save(client, producer.team.id, **{**FORM, "frame_ancestors": ""})
        assert resp.status_code == 403, role
    auth.login("outsider")  # the owner of another team: acme is not there for it
    token = _csrf_from(client.get("/consumers").get_data(as_text=True))
    assert client.post(f"/consumers/portal-settings/{producer.team.id}",
                       data={"csrf_token": token, "frame_ancestors": ""}).status_code == 404
    assert stored(producer)["frame_ancestors"] == ["http://localhost:8080", "https://app.example.com"]


def test_a_change_without_the_csrf_token_is_refused(client, auth, users, producer):
    auth.login("owner")
    resp = client.post(f"/consumers/portal-settings/{producer.team.id}", data=FORM)
    assert resp.status_code == 400
    assert stored(producer) == NONE_SET
