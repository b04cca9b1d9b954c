"""/metrics: Prometheus text, computed from the database and Redis at scrape time, so every process
answers the same; counters never go back when the sweeper folds; who may scrape."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dashboard.app import create_app
from dashboard.operations.sweeper import sweep_once

from tests.support.pipeline import deliver_due


def scrape(client, **kwargs) -> dict:
    resp = client.get("/metrics", **kwargs)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.content_type.startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(resp.get_data(as_text=True)):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


def test_it_counts_outcomes_waiting_work_incidents_and_latency(app, client, producer, receiver, clock, config):
    ok = producer.subscribe(receiver.url + "/ok", event_types=["file.updated"])
    broken = producer.subscribe(receiver.url + "/status/400", event_types=["file.deleted"])
    for _ in range(5):
        producer.publish("file.updated")
        producer.publish("file.deleted")
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(minutes=2)
    sweep_once(app)  # a dead_letters incident opens
    producer.post(f"/api/v1/subscriptions/{broken['id']}/pause")
    producer.publish("file.deleted")  # held

    before = scrape(client)
    okl, bad = {"subscription": ok["id"], "team": "acme"}, {"subscription": broken["id"], "team": "acme"}
    assert value(before, "promesa_attempts_total", outcome="succeeded", **okl) == 5
    assert value(before, "promesa_attempts_total", outcome="failed", **bad) == 15
    assert value(before, "promesa_dead_lettered_total", **bad) == 5
    assert value(before, "promesa_dead_letters_waiting", **bad) == 5
    assert value(before, "promesa_held_deliveries", **bad) == 1
    assert value(before, "promesa_unresolved_incidents", rule="dead_letters", state="open") == 1
    [incident] = [dict(k[1]) for k in before if k[0] == "promesa_incident_open"]
    assert incident["subscription"] == broken["id"] and incident["incident_id"].startswith("inc_")

    # A second process (another app object on the same database and Redis) answers the same.
    other = create_app(config)
    with other.app_context():
        assert scrape(other.test_client()) == before

    # Folding moves figures from the live minutes to the totals: counters never jump or go back.
    for _ in range(3):
        clock.advance(minutes=5)
        sweep_once(app)
    after = scrape(client)
    for key in [k for k in before if k[0] in ("promesa_attempts_total", "promesa_dead_lettered_total")]:
        assert after[key] == before[key], key
    # The histogram lags a pass (attempt ids are folded once no writer can still hold a lower one).
    assert value(after, "promesa_attempt_duration_seconds_count") == 20
    assert value(after, "promesa_attempt_duration_seconds_bucket", le="10.0") == 20
    assert value(after, "promesa_attempt_duration_seconds_sum") >= 0

    clock.advance(minutes=11)
    producer.post(f"/api/v1/subscriptions/{broken['id']}/resume")  # due, and nobody delivers it
    clock.advance(minutes=3)
    samples = scrape(client)
    assert value(samples, "promesa_due_deliveries") == 1
    assert value(samples, "promesa_due_oldest_age_seconds") == pytest.approx(180, abs=1)
    assert value(samples, "promesa_redis_ready") >= 1


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_labels_stop_at_the_configured_number(app, client, producer, receiver, clock):
    app.config["PROMESA_METRICS_SUBSCRIPTION_LABELS"] = 1
    first = producer.subscribe(receiver.url + "/ok")
    producer.subscribe(receiver.url + "/ok")
    producer.subscribe(receiver.url + "/ok")
    producer.publish()
    deliver_due(app, clock)
    samples = scrape(client)
    assert value(samples, "promesa_attempts_total", subscription=first["id"], team="acme", outcome="succeeded") == 1
    assert value(samples, "promesa_attempts_total", subscription="other", team="other", outcome="succeeded") == 2
    assert {dict(k[1]).get("subscription") for k in samples if k[0] == "promesa_attempts_total"} == \
        {first["id"], "other"}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_only_loopback_without_a_token_and_only_the_token_with_one(app, client):
    assert client.get("/metrics").status_code == 200
    resp = client.get("/metrics", environ_base={"REMOTE_ADDR": "10.1.2.3"})
    assert resp.status_code == 403 and b"loopback" in resp.data
    app.config["PROMESA_METRICS_TOKEN"] = "s3cret-token"
    assert client.get("/metrics").status_code == 401  # loopback is not enough once a token is set
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    scrape(client, headers={"Authorization": "Bearer s3cret-token"}, environ_base={"REMOTE_ADDR": "10.1.2.3"})


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_behind_a_trusted_proxy_a_client_saying_it_is_loopback_reads_neither_metrics_nor_details(config):
    """gunicorn reached directly, past the proxy: X-Forwarded-For says whatever the client likes."""
    app = create_app({**config, "PROMESA_TRUSTED_PROXIES": 1, "PROMESA_METRICS_TOKEN": ""})
    client = app.test_client()
    claims_loopback = {"environ_base": {"REMOTE_ADDR": "127.0.0.1"}, "headers": {"X-Forwarded-For": "127.0.0.1"}}
    refused = client.get("/metrics", **claims_loopback)
    assert refused.status_code == 403 and b"PROMESA_METRICS_TOKEN" in refused.data
    assert client.get("/metrics").status_code == 403  # the proxy itself, on this machine, counts for no one either
    ready = client.get("/readyz?verbose=1", **claims_loopback).get_json()
    assert ready == {"status": "ready", "missing": []}  # no checks, no workers' host names and PIDs
    app.config["PROMESA_METRICS_TOKEN"] = token = "f" * 8 + "0123456789abcdef" * 3
    bearer = {"Authorization": f"Bearer {token}", "X-Forwarded-For": "203.0.113.9"}
    scrape(client, headers=bearer)
    assert client.get("/readyz?verbose=1", headers=bearer).get_json()["checks"]["database"] == "ok"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_replays_running_counts_the_replays_not_finished(app, client, clock):
    from dashboard.core.extensions import db
    from dashboard.models import Replay

    assert value(scrape(client), "promesa_replays_running") == 0
    for state in ("running", "queued", "finished"):
        db.session.add(Replay(actor_kind="system", actor="system", filter={}, filter_key=state, total=1, done=0,
                              succeeded=0, failed=0, state=state, created_at=clock.now(),
                              finished_at=clock.now() if state == "finished" else None))
    db.session.commit()
    assert value(scrape(client), "promesa_replays_running") == 2