"""Quotas: each one refuses past its limit with a body naming it, admins override them (CLI, dashboard), the team
sees them (a page, GET /api/v1/team, the OpenAPI document), and the events-per-second bucket is one for every web
process."""

from __future__ import annotations

import time

import pytest
import redis
from sqlalchemy import func, select, update

from dashboard.app import create_app
from dashboard.cli import cli
from dashboard.core.extensions import db
from dashboard.ingest import quotas
from dashboard.models import AuditEntry, Delivery, DeliveryState, Event, Team, TeamQuota

from tests.conftest import Producer


def _event(n: int = 0) -> dict:
    return {"type": "file.updated", "data": {"resource_id": f"f_{n}"}}


def _batch(producer, size: int, start: int = 0):
    return producer.post("/api/v1/events/batch", {"events": [_event(start + i) for i in range(size)]})


def _assert_refused(resp, quota: str, limit: int, retry_after: int):
    assert resp.status_code == 429, resp.get_json()
    body = resp.get_json()
    assert (body["quota"], body["limit"], body["retry_after_seconds"]) == (quota, limit, retry_after)
    assert quota in body["error"]
    assert resp.headers["Retry-After"] == str(retry_after)


def test_events_per_second_refuses_past_the_rate_and_refills_with_time(app, producer, receiver, clock):
    producer.subscribe(receiver.url + "/ok")
    quotas.set_override(producer.team, "events_per_second", 5, actor=("system", "test"))
    for n in range(5):
        producer.publish(data={"resource_id": f"f_{n}"})
    refused = producer.post("/api/v1/events", _event(99))
    _assert_refused(refused, "events_per_second", 5, 1)
    assert db.session.scalar(select(Event.key).where(Event.resource_id == "f_99")) is None  # nothing stored
    clock.advance(seconds=0.2)  # one token back
    producer.publish(data={"resource_id": "f_5"})
    assert producer.post("/api/v1/events", _event(6)).status_code == 429


def test_a_batch_counts_as_its_number_of_events(app, producer, clock):
    quotas.set_override(producer.team, "events_per_second", 10, actor=("system", "test"))
    assert _batch(producer, 7).status_code == 202
    # 3 tokens left: 7 more need 4 more tokens, 0.4 s at 10/s, so Retry-After says 1.
    _assert_refused(_batch(producer, 7, start=10), "events_per_second", 10, 1)
    assert _batch(producer, 3, start=20).status_code == 202
    assert producer.post("/api/v1/events", _event(30)).status_code == 429
    clock.advance(seconds=1)
    # A batch larger than the bucket goes once the bucket is full, and leaves a debt the next events wait for.
    quotas.set_override(producer.team, "events_per_second", 2, actor=("system", "test"))
    assert _batch(producer, 10, start=40).status_code == 202
    _assert_refused(producer.post("/api/v1/events", _event(60)), "events_per_second", 2, 5)


def test_duplicates_take_no_tokens(app, producer):
    quotas.set_override(producer.team, "events_per_second", 1, actor=("system", "test"))
    first = producer.post("/api/v1/events", {**_event(), "id": "evt_same"})
    again = producer.post("/api/v1/events", {**_event(), "id": "evt_same"})
    assert (first.status_code, again.status_code, again.get_json()["duplicate"]) == (202, 202, True)


def test_the_bucket_is_shared_by_two_web_processes(app, config, producer):
    """Two app instances (two gunicorn workers, or two machines) on one Redis take from one bucket."""
    quotas.set_override(producer.team, "events_per_second", 4, actor=("system", "test"))
    other = create_app(config)
    try:
        second = other.test_client()
        codes = []
        for n in range(6):
            client = producer.client if n % 2 == 0 else second
            codes.append(client.post("/api/v1/events", json=_event(n), headers=producer.headers()).status_code)
        assert codes == [202, 202, 202, 202, 429, 429]
    finally:
        with other.app_context():
            db.engine.dispose()


def test_queued_deliveries_past_the_ceiling_refuse_events_until_they_drain(app, producer, receiver):
    producer.subscribe(receiver.url + "/ok", event_types=["file.*"])
    producer.subscribe(receiver.url + "/ok2", event_types=["file.*"])
    quotas.set_override(producer.team, "queued_deliveries", 5, actor=("system", "test"))
    producer.publish(data={"resource_id": "a"})
    producer.publish(data={"resource_id": "b"})  # 4 owed: nothing delivers them in this test
    _assert_refused(producer.post("/api/v1/events", _event(3)), "queued_deliveries", 5, 60)
    assert "owes 4 deliveries" in producer.post("/api/v1/events", _event(3)).get_json()["error"]
    # An event no subscription wants adds nothing owed: it is taken.
    assert producer.post("/api/v1/events", {"type": "nobody.wants", "data": {}}).status_code == 202
    # Delivered: the sweeper's count (what the database says) lets the team in again.
    db.session.execute(update(Delivery).values(state=DeliveryState.SUCCEEDED))
    db.session.commit()
    assert quotas.refresh().get(producer.team.id, 0) == 0
    producer.publish(data={"resource_id": "c"})
    assert producer.get("/api/v1/team").get_json()["quotas"]["queued_deliveries"]["used"] == 2


def test_a_flushed_redis_gets_the_overrides_back_from_the_next_sweep(app, config, producer):
    quotas.set_override(producer.team, "events_per_second", 1, actor=("system", "test"))
    conn = redis.Redis.from_url(config["REDIS_URL"])
    conn.delete(quotas.team_key(app, producer.team.id))  # as a FLUSHALL would
    assert [producer.post("/api/v1/events", _event(n)).status_code for n in range(3)] == [202, 202, 202]
    quotas.refresh()
    assert producer.post("/api/v1/events", _event(10)).status_code == 202
    assert producer.post("/api/v1/events", _event(11)).status_code == 429


def test_ingest_goes_on_when_redis_is_away(app, producer):
    quotas.set_override(producer.team, "events_per_second", 1, actor=("system", "test"))
    bucket = quotas.Bucket.for_app(app)
    bucket.conn = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, socket_timeout=0.2, retry=None)
    started = time.monotonic()
    codes = [producer.post("/api/v1/events", _event(n)).status_code for n in range(5)]
    assert codes == [202] * 5
    assert time.monotonic() - started < 3  # asked once, then left alone for REDIS_BACKOFF_SECONDS


def test_subscriptions_per_team(app, producer, receiver):
    quotas.set_override(producer.team, "subscriptions", 2, actor=("system", "test"))
    first = producer.subscribe(receiver.url + "/a")
    producer.subscribe(receiver.url + "/b")
    refused = producer.post("/api/v1/subscriptions", {"url": receiver.url + "/c"})
    assert refused.status_code == 409
    assert (refused.get_json()["quota"], refused.get_json()["limit"]) == ("subscriptions", 2)
    assert "Retry-After" not in refused.headers
    assert producer.client.delete(f"/api/v1/subscriptions/{first['id']}", headers=producer.headers()).status_code == 200
    producer.subscribe(receiver.url + "/c")


def test_test_events_at_most_one_every_few_seconds(app, producer, receiver, clock):
    sub = producer.subscribe(receiver.url + "/ok")
    assert producer.post(f"/api/v1/subscriptions/{sub['id']}/test").status_code == 202
    clock.advance(seconds=2)
    _assert_refused(producer.post(f"/api/v1/subscriptions/{sub['id']}/test"), "test_event_seconds", 5, 3)
    other = producer.subscribe(receiver.url + "/other")  # per subscription: another one may have its own
    assert producer.post(f"/api/v1/subscriptions/{other['id']}/test").status_code == 202
    clock.advance(seconds=3)
    assert producer.post(f"/api/v1/subscriptions/{sub['id']}/test").status_code == 202


def test_test_events_are_not_events_per_second(app, producer, receiver):
    quotas.set_override(producer.team, "events_per_second", 1, actor=("system", "test"))
    quotas.set_override(producer.team, "test_event_seconds", 0, actor=("system", "test"))
    sub = producer.subscribe(receiver.url + "/ok")
    assert [producer.post(f"/api/v1/subscriptions/{sub['id']}/test").status_code for _ in range(3)] == [202] * 3
    producer.publish()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_overrides_from_the_cli(app, producer, clock):
    runner = app.test_cli_runner()
    result = runner.invoke(cli, ["teams", "quota", "acme", "events_per_second", "2"])
    assert result.exit_code == 0, result.output
    assert "events_per_second = 2" in result.output
    assert [producer.post("/api/v1/events", _event(n)).status_code for n in range(3)] == [202, 202, 429]
    shown = runner.invoke(cli, ["teams", "quotas", "acme"]).output
    assert "events_per_second\t2 (own)\tdefault 100000" in shown
    assert "subscriptions\t100\tdefault 100\tused 0" in shown
    assert "acme\tevents_per_second=2" in runner.invoke(cli, ["teams", "list"]).output
    entry = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "team.quota_changed"))
    assert (entry.actor, entry.detail["after"]) == ("cli", 2)
    assert runner.invoke(cli, ["teams", "quota", "acme", "events_per_second", "0"]).exit_code != 0
    assert runner.invoke(cli, ["teams", "quota", "nobody", "subscriptions", "3"]).exit_code != 0
    assert runner.invoke(cli, ["teams", "quota", "acme", "events_per_second", "default"]).exit_code == 0
    assert db.session.scalars(select(TeamQuota)).all() == []
    clock.advance(seconds=0.001)  # the default rate refills the emptied bucket at once
    assert producer.post("/api/v1/events", _event(9)).status_code == 202


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_overrides_from_the_dashboard_by_admins_only(app, client, auth, users, producer):
    acme = producer.team
    other = db.session.scalar(select(Team).where(Team.name == "other"))
    auth.login("owner")
    page = client.get("/quotas").get_data(as_text=True)
    assert "Quotas of acme" in page and "Quotas of other" not in page and "<input name=" not in page
    assert client.post(f"/quotas/{acme.id}", data={"csrf_token": auth.csrf("/quotas"),
                                                   "subscriptions": "1"}).status_code == 403
    auth.login("admin")
    token = auth.csrf("/quotas")
    page = client.get("/quotas").get_data(as_text=True)
    assert "Quotas of acme" in page and "Quotas of other" in page
    bad = client.post(f"/quotas/{acme.id}", data={"csrf_token": token, "subscriptions": "3",
                                                  "events_per_second": "lots"})
    assert bad.status_code == 303 and db.session.scalars(select(TeamQuota)).all() == []  # nothing half-way
    assert client.post(f"/quotas/{acme.id}", data={"csrf_token": token, "events_per_second": "2"}).status_code == 302
    assert quotas.limits(acme.id)["events_per_second"] == 2 and quotas.limits(other.id)["events_per_second"] == 100_000
    assert [producer.post("/api/v1/events", _event(n)).status_code for n in range(3)] == [202, 202, 429]
    assert client.post(f"/quotas/{acme.id}", data={"events_per_second": "5"}).status_code == 400  # no CSRF token
    assert client.post(f"/quotas/{acme.id}", data={"csrf_token": token}).status_code == 302
    assert quotas.overrides(acme.id) == {}
    assert client.post("/quotas/999999", data={"csrf_token": token}).status_code == 404


def test_the_team_sees_every_quota_in_the_api_and_the_openapi_document(app, producer, receiver):
    producer.subscribe(receiver.url + "/ok")
    quotas.set_override(producer.team, "subscriptions", 7, actor=("system", "test"))
    producer.publish()
    shown = producer.get("/api/v1/team").get_json()["quotas"]
    assert set(shown) == {"subscriptions", "events_per_second", "queued_deliveries", "test_event_seconds",
                          "event_types", "event_type_versions", "catalog_bytes", "declarations_per_minute",
                          "consumers", "subscriptions_per_consumer"}
    assert shown["subscriptions"] | {"description": None} == {"limit": 7, "default": 100, "overridden": True,
                                                               "used": 1, "description": None}
    assert (shown["events_per_second"]["limit"], shown["events_per_second"]["overridden"]) == (100_000, False)
    assert (shown["queued_deliveries"]["limit"], shown["queued_deliveries"]["used"]) == (100_000, 1)
    assert shown["test_event_seconds"]["limit"] == 5
    doc = producer.client.get("/api/v1/openapi.json").get_json()
    for path in ("/events", "/events/batch", "/subscriptions/{subscription_id}/test"):
        refused = doc["paths"][path]["post"]["responses"]["429"]
        assert refused["content"]["application/json"]["schema"]["$ref"].endswith("/QuotaError")
        assert "Retry-After" in refused["headers"]
    schemas = doc["components"]["schemas"]
    assert {"quota", "limit", "retry_after_seconds"} <= set(schemas["QuotaError"]["properties"])
    assert "quotas" in schemas["Team"]["required"]
    assert set(schemas["Quotas"]["properties"]) == set(shown)


def test_quotas_are_per_team(app, client, producer):
    beta = Producer(client, "beta")
    quotas.set_override(producer.team, "events_per_second", 1, actor=("system", "test"))
    producer.publish()
    assert producer.post("/api/v1/events", _event(1)).status_code == 429
    assert [beta.post("/api/v1/events", _event(n)).status_code for n in range(3)] == [202] * 3


def _count_commands(bucket, monkeypatch) -> list:
    sent = []
    real = bucket.conn.execute_command

    def counted(*args, **options):
        sent.append(args[0])
        return real(*args, **options)

    monkeypatch.setattr(bucket.conn, "execute_command", counted)
    return sent


def _bucket_state(config, app, team_id) -> dict:
    found = redis.Redis.from_url(config["REDIS_URL"]).hgetall(quotas.team_key(app, team_id))
    return {k.decode(): float(v) for k, v in found.items()}


def test_a_lease_admits_the_next_requests_without_a_redis_round_trip(app, producer, receiver, monkeypatch):
    producer.subscribe(receiver.url + "/ok")
    sent = _count_commands(quotas.Bucket.for_app(app), monkeypatch)
    producer.publish()  # (the first may load the script: EVALSHA answers NOSCRIPT, then EVAL)
    sent.clear()
    for n in range(30):
        producer.publish(data={"resource_id": f"again-{n}"})
    assert _batch(producer, 50).status_code == 202
    assert sent == []  # 80 events and deliveries, all from the default rate's lease (1,000 tokens)


def test_a_lease_is_real_tokens_and_goes_back_with_the_next_call(app, config, producer, receiver, clock):
    producer.subscribe(receiver.url + "/ok")
    quotas.set_override(producer.team, "events_per_second", 1_000, actor=("system", "test"))
    quotas.set_override(producer.team, "queued_deliveries", 1_000_000, actor=("system", "test"))
    producer.publish()
    # The request's token and a lease of 1 % of the rate left the bucket; the lease's room for owed deliveries
    # (0.1 % of the ceiling) is counted as owed until it comes back.
    state = _bucket_state(config, app, producer.team.id)
    assert (state["tokens"], state["owed"]) == (1_000 - 1 - 10, 1 + 1_000)
    for n in range(10):
        producer.publish(data={"resource_id": f"leased-{n}"})
    assert _bucket_state(config, app, producer.team.id) == state  # the lease's ten events asked nobody
    producer.publish(data={"resource_id": "asks"})
    state = _bucket_state(config, app, producer.team.id)
    assert (state["tokens"], state["owed"]) == (989 - 1 - 10, 1 + 10 + 1 + 1_000)  # the room left came back
    clock.advance(seconds=quotas.LEASE_SECONDS)  # the lease lapses unused: its ten tokens go back with the next call
    producer.publish(data={"resource_id": "later"})
    state = _bucket_state(config, app, producer.team.id)
    assert state["tokens"] == 1_000 - 1 - 10  # refilled to the rate (the ten returned add nothing past it)
    assert state["owed"] == 13 + 1_000


def test_two_processes_with_leases_never_admit_more_than_the_rate(app, config, producer):
    """Leases are taken from the one bucket: two web processes alternating still let the rate through, no more."""
    quotas.set_override(producer.team, "events_per_second", 200, actor=("system", "test"))  # leases of 2
    other = create_app(config)
    try:
        second = other.test_client()
        codes = [(producer.client if n % 2 == 0 else second).post(
            "/api/v1/events", json=_event(n), headers=producer.headers()).status_code for n in range(230)]
        assert codes.count(202) == 200 and codes.count(429) == 30  # (the order: a lease held by one is not the other's)
        assert db.session.scalar(select(func.count()).select_from(Event)) == 200
    finally:
        with other.app_context():
            db.engine.dispose()


def test_a_lowered_quota_drops_this_process_lease_at_once(app, producer):
    producer.publish()  # a lease of 1,000 tokens from the default rate
    quotas.set_override(producer.team, "events_per_second", 1, actor=("system", "test"))
    assert producer.post("/api/v1/events", _event(1)).status_code == 202  # the bucket: one token a second
    assert producer.post("/api/v1/events", _event(2)).status_code == 429
