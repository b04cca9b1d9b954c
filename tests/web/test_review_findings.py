"""What an outside review found: each finding's fix, with a test that fails on the code before it."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import func, select

from dashboard.accounts.access import SYSTEM_TEAM
from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Delivery, Incident, IncidentState, Replay, Team
from tests.conftest import Producer
from tests.operations.test_replays import make_dead

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@pytest.fixture(autouse=True)
def _quick_drains(app):
    app.config["PROMESA_DRAIN_LINGER_SECONDS"] = 0.0


def _replays():
    return db.session.scalar(select(func.count()).select_from(Replay))


def test_an_operator_cannot_replay_the_system_teams_dead_letters(app, client, auth, users, clock, receiver):
    sink_sub, sink_dead = make_dead(app, clock, Producer(client, SYSTEM_TEAM), receiver, 400, ["file.updated"])
    system = db.session.scalar(select(Team).where(Team.name == SYSTEM_TEAM))
    auth.login("operator")
    by_team = client.post("/dead-letters/replay", data={"team": str(system.id), "csrf_token": auth.csrf()})
    assert by_team.status_code == 403
    selected = client.post("/dead-letters/replay", data={"which": "selected", "delivery_id": list(sink_dead),
                                                         "csrf_token": auth.csrf()})
    assert selected.status_code == 302
    [replay] = db.session.scalars(select(Replay)).all()
    assert replay.total == 0  # the sinks' letters are outside what an operator may replay
    assert {d.state for d in db.session.scalars(select(Delivery).where(Delivery.subscription_id == sink_sub))} \
        == {"dead"}


def test_an_owner_naming_another_teams_subscription_stores_no_replay(app, client, auth, users, clock, receiver):
    beta_sub, _ = make_dead(app, clock, Producer(client, "other"), receiver, 400, ["file.updated"])
    auth.login("owner")  # acme's owner
    before_audit = db.session.scalar(select(func.count()).select_from(AuditEntry))
    resp = client.post("/dead-letters/replay", data={"subscription": beta_sub, "csrf_token": auth.csrf()})
    assert resp.status_code == 302
    assert _replays() == 0
    assert db.session.scalar(select(func.count()).select_from(AuditEntry)) == before_audit
    page = client.get(resp.headers["Location"]).get_data(as_text=True)
    assert "no such subscription" in page


def test_promesas_own_backlog_incidents_reach_oncall_and_operators(app, client, auth, users, clock):
    db.session.add(Incident(subscription_id=None, team_id=None, rule="backlog", state=IncidentState.OPEN,
                            opened_at=clock.now(), first_seen_at=clock.now(), last_seen_at=clock.now(),
                            figures={}))
    db.session.commit()
    for role in ("oncall", "operator"):
        auth.login(role)
        page = client.get("/incidents").get_data(as_text=True)
        assert "Delivery backlog" in page, role


@pytest.mark.parametrize("path", ["/dead-letters?team=99999999999999999999", "/dead-letters?team=%C2%B2"])
def test_team_numbers_past_64_bits_or_not_ascii_are_a_400(client, auth, users, path):
    auth.login("operator")
    resp = client.get(path)
    assert resp.status_code == 400 and b"team must be a number" in resp.data


@pytest.mark.parametrize("path", ["/tokens/99999999999999999999/revoke", "/users/99999999999999999999/role",
                                  "/users/99999999999999999999/deactivate"])
def test_ids_past_64_bits_in_a_path_are_no_row(client, auth, users, path):
    auth.login("admin")
    assert client.post(path, data={"csrf_token": auth.csrf(), "role": "member"}).status_code == 404


def test_a_rule_forms_back_link_cannot_carry_a_header(app, client, auth, users, producer, receiver):
    sub = producer.subscribe(receiver.url + "/ok")
    auth.login("owner")
    resp = client.post(f"/subscriptions/{sub['id']}/rules/dead_letters",
                       data={"enabled": "on", "threshold": "3", "back": "/incidents/\r\nX: y", "csrf_token": auth.csrf()})
    assert resp.status_code == 302
    assert resp.headers["Location"].endswith(f"/subscriptions/{sub['id']}") and "X" not in resp.headers


@pytest.mark.parametrize("path,body", [
    ("/api/v1/events", {"type": "promesa.incident.opened", "data": {}}),
    ("/api/v1/events", {"type": "Promesa.check", "data": {}}),
    ("/api/v1/event-types", {"name": "promesa.test", "schema": {"type": "object"}}),
])
def test_producers_cannot_send_or_declare_promesas_own_types(producer, path, body):
    resp = producer.post(path, body)
    assert resp.status_code == 422  # well-formed, so the fuzzer's contract holds: refused for what it means
    message = resp.get_json()["error"]
    assert "promesa." in message and "Promesa's own" in message


def test_the_subscription_list_is_paged(producer, receiver):
    made = [producer.subscribe(receiver.url + f"/ok/{i}")["id"] for i in range(5)]
    seen, after = [], None
    while True:
        page = producer.get("/api/v1/subscriptions?limit=2" + (f"&after={after}" if after else "")).get_json()
        assert len(page["data"]) <= 2
        seen += [s["id"] for s in page["data"]]
        after = page["next_after"]
        if after is None:
            break
    assert seen == sorted(made)
    assert producer.get("/api/v1/subscriptions?limit=0").status_code == 400


def test_a_trusted_proxy_without_a_metrics_token_is_warned_about(config, caplog):
    from dashboard.app import create_app

    with caplog.at_level(logging.WARNING, logger="dashboard.web.metrics"):
        create_app({**config, "PROMESA_TRUSTED_PROXIES": 1, "PROMESA_METRICS_TOKEN": None})
    assert any("PROMESA_METRICS_TOKEN" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dashboard.web.metrics"):
        create_app({**config, "PROMESA_TRUSTED_PROXIES": 1, "PROMESA_METRICS_TOKEN": "s3cret-token"})
    assert not any("PROMESA_METRICS_TOKEN" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("path,form", [
    ("/tokens", {"team": "acme\x00"}),
    ("/users", {"email": "x\x00@example.com", "role": "member"}),
    ("/dead-letters/replay", {"event_type": "file.\x00updated"}),
    ("/dead-letters/replay", {"which": "selected", "delivery_id": "dlv_\x00"}),
])
def test_nul_in_a_form_field_is_a_400_and_stores_nothing(client, auth, users, path, form):
    auth.login("admin")
    before = db.session.scalar(select(func.count()).select_from(AuditEntry))
    resp = client.post(path, data={**form, "csrf_token": auth.csrf()})
    assert resp.status_code == 400 and b"NUL" in resp.data
    assert db.session.scalar(select(func.count()).select_from(AuditEntry)) == before


def test_nul_in_a_disable_reason_is_a_400(client, auth, users, producer, receiver):
    sub = producer.subscribe(receiver.url + "/ok")
    auth.login("operator")
    resp = client.post(f"/subscriptions/{sub['id']}/disable", data={"reason": "gone\x00", "csrf_token": auth.csrf()})
    assert resp.status_code == 400
    assert producer.get(f"/api/v1/subscriptions/{sub['id']}").get_json()["state"] == "active"
