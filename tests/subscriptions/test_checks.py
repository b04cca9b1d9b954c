"""The receiver check of a subscription, through the API, run by a real RQ worker against real
receivers on 127.0.0.1 (the SDK tests' receivers): the same rules as `promesa-receiver check`, sent
with the subscription's secrets, timeouts and rate limit, and kept apart from its deliveries."""

from __future__ import annotations

import itertools

import pytest
from promesa_receiver.check import ALL_RULES, CHECK_HEADER, EVENT_TYPE, NOT_JUDGED_DEPENDENT, RULES
from promesa_receiver.signing import new_secret
from sqlalchemy import func, select

from dashboard.core import crypto
from dashboard.core.extensions import db
from dashboard.models import (
    Attempt,
    AuditEntry,
    Check,
    Delivery,
    Event,
    Incident,
    OutcomeCount,
    Subscription,
)
from dashboard.operations import incidents
from dashboard.subscriptions import checks
from tests.conftest import Producer
from tests.operations.test_replays import run_worker
from tests.sdk.conftest import CASES, SLOW_SECONDS

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def by_rule(report: dict) -> dict[str, dict]:
    assert [r["rule"] for r in report["results"]] == list(RULES)
    return {r["rule"]: r for r in report["results"]}


def outcome(report: dict) -> tuple[set, set]:
    """(failed rules, rules not judged)."""
    rules = by_rule(report)
    return ({n for n, r in rules.items() if r["passed"] is False}, {n for n, r in rules.items() if r["passed"] is None})


def run_check(app, producer: Producer, subscription_id: str) -> dict:
    """Start a check over the API, let a real RQ worker run its job, and read the report over the API."""
    started = producer.post(f"/api/v1/subscriptions/{subscription_id}/checks")
    assert started.status_code == 202, started.get_json()
    check_id = started.get_json()["id"]
    assert check_id.startswith("chk_")
    running = producer.get(f"/api/v1/checks/{check_id}").get_json()
    assert (running["state"], running["results"], running["finished_at"]) == ("running", [], None)
    run_worker(app)
    report = producer.get(f"/api/v1/checks/{check_id}").get_json()
    assert report["state"] == "finished" and report["finished_at"] and report["error"] is None, report
    assert set(report) >= {"id", "subscription_id", "state", "started_at", "finished_at", "results"}
    return report


def hold_secret(subscription_id: str, secret: str) -> None:
    """The subscription signs with `secret`: the one the receiver was started with."""
    db.session.get(Subscription, subscription_id).secret_ciphertext = crypto.encrypt(secret)
    db.session.commit()


def nothing_delivered(subscription_id: str) -> None:
    """No trace of the check among deliveries: no event, delivery, attempt, outcome count or incident."""
    assert db.session.scalar(select(func.count()).select_from(Event)) == 0
    assert db.session.scalar(select(func.count()).select_from(Delivery)) == 0
    assert db.session.scalar(select(func.count()).select_from(Attempt)) == 0
    assert db.session.scalar(select(func.count()).select_from(OutcomeCount)) == 0
    assert db.session.scalar(select(func.count()).select_from(Incident)) == 0


@pytest.mark.parametrize("scheme", ["promesa", "standard-webhooks"])
def test_the_example_receiver_passes_every_rule(app, producer, example, bad_receiver, scheme):
    sub = producer.subscribe(bad_receiver.url + "/ok", signature_scheme=scheme)
    url = example.start(sub["secret"], scheme=scheme)  # the receiver holds the secret the answer showed
    assert producer.client.patch(f"/api/v1/subscriptions/{sub['id']}", json={"url": url},
                                 headers=producer.headers()).status_code == 200
    report = run_check(app, producer, sub["id"])
    assert outcome(report) == (set(), {"https"})
    assert "loopback" in by_rule(report)["https"]["detail"]  # null: private targets allowed, loopback host
    assert example.queued_event_ids() == [f"evt_{report['id']}_signed"] * 2
    assert bad_receiver.count() == 0


@sqlite_only  # the slow case waits 6 s: once is enough
@pytest.mark.parametrize("case", CASES)
def test_a_bad_receiver_fails_exactly_its_rules(app, producer, case_url, bad_receiver, secret, case):
    sub = producer.subscribe(case_url)
    hold_secret(sub["id"], secret)  # the slow one is the example receiver, verifying with the fixture's secret
    report = run_check(app, producer, sub["id"])
    must_fail, not_judged = CASES[case]
    assert outcome(report) == (must_fail, not_judged)
    rules = by_rule(report)
    contract = f"{app.config['PROMESA_BASE_URL']}/subscriptions/{sub['id']}/contract"
    if case == "careless":
        assert rules["forged_rejected"]["advice"].startswith(
            "your endpoint accepted a request signed with the wrong secret: verify X-Signature over the raw body")
        assert contract in rules["forged_rejected"]["advice"]  # the subscription's contract page, linked
        assert "verifyPromesaSignature" in rules["forged_rejected"]["advice"]
    if case == "redirect":
        assert f"register {bad_receiver.url}/final " in rules["no_redirect"]["advice"]
        assert bad_receiver.count("/final") == 0  # never followed
    if case == "slow":
        assert rules["fast_answer"]["detail"].startswith(f"answered in {SLOW_SECONDS}.")
    if case == "error":
        for rule in ("forged_rejected", "stale_rejected", "tampered_rejected"):
            assert rules[rule]["passed"] is None and rules[rule]["detail"] == NOT_JUDGED_DEPENDENT
    nothing_delivered(sub["id"])


@sqlite_only
def test_check_requests_never_show_as_deliveries(app, producer, bad_receiver, clock):
    """A check that fails everything it can (500s) leaves no delivery, attempt, chart point, incident or
    dead letter; the overview, the delivery list and the incident rules see nothing."""
    sub = producer.subscribe(bad_receiver.url + "/status/500", description="checked")
    run_check(app, producer, sub["id"])
    assert bad_receiver.count() == 5
    assert producer.get(f"/api/v1/subscriptions/{sub['id']}/deliveries").get_json()["data"] == []
    incidents.check_rules(clock.now())
    nothing_delivered(sub["id"])
    diagnosis = producer.get(f"/api/v1/subscriptions/{sub['id']}/diagnosis").get_json()
    assert (diagnosis["attempts"], diagnosis["groups"]) == (0, [])  # the check's 500s are no failed deliveries


@sqlite_only
def test_each_request_is_signed_with_every_current_secret_and_names_the_check(app, producer, bad_receiver, clock):
    """During a rotation's grace both secrets sign, as they sign deliveries; each request carries the header."""
    from promesa_receiver import verify

    sub = producer.subscribe(bad_receiver.url + "/ok")
    rotated = producer.post(f"/api/v1/subscriptions/{sub['id']}/rotate-secret", {"grace_seconds": 3600}).get_json()
    report = run_check(app, producer, sub["id"])
    signed = bad_receiver.requests[0]
    assert signed.headers[CHECK_HEADER] == report["id"] and signed.headers["X-Event-Type"] == EVENT_TYPE
    assert signed.headers["X-Signature"].count("v1=") == 2
    verify(signed.body, signed.headers["X-Signature"], [sub["secret"]])  # the previous secret, still in grace
    verify(signed.body, signed.headers["X-Signature"], [rotated["secret"]])  # and the new one
    assert all(r.headers[CHECK_HEADER] == report["id"] for r in bad_receiver.requests)


@sqlite_only
def test_a_second_check_within_a_minute_is_refused_with_429(app, producer, bad_receiver, clock):
    sub = producer.subscribe(bad_receiver.url + "/ok")
    first = producer.post(f"/api/v1/subscriptions/{sub['id']}/checks")
    assert first.status_code == 202
    again = producer.post(f"/api/v1/subscriptions/{sub['id']}/checks")
    assert again.status_code == 429 and "at most one a minute" in again.get_json()["error"]
    assert again.headers["Retry-After"] == "60"
    clock.advance(seconds=61)  # a minute later, but the first still runs: one at a time
    running = producer.post(f"/api/v1/subscriptions/{sub['id']}/checks")
    assert running.status_code == 409 and first.get_json()["id"] in running.get_json()["error"]
    run_worker(app)
    assert producer.post(f"/api/v1/subscriptions/{sub['id']}/checks").status_code == 202
    actions = db.session.scalars(select(AuditEntry.action).where(AuditEntry.subscription_id == sub["id"])
                                 .order_by(AuditEntry.id)).all()
    assert actions == ["subscription.created", "check.started", "check.finished", "check.started"]
    entry = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "check.started"))
    assert entry.actor_kind == "token" and entry.target == f"check:{first.get_json()['id']}"


@sqlite_only
def test_a_check_lost_with_its_worker_stops_blocking_after_a_while(app, producer, bad_receiver, clock):
    sub = producer.subscribe(bad_receiver.url + "/ok")
    lost = producer.post(f"/api/v1/subscriptions/{sub['id']}/checks").get_json()["id"]
    clock.advance(seconds=checks.STALE_SECONDS + 1)
    assert producer.post(f"/api/v1/subscriptions/{sub['id']}/checks").status_code == 202
    assert producer.get(f"/api/v1/checks/{lost}").get_json()["error"].startswith("abandoned")


@sqlite_only
def test_the_subscriptions_rate_limit_spaces_the_requests(app, producer, bad_receiver):
    sub = producer.subscribe(bad_receiver.url + "/ok", rate_limit_per_s=5)
    run_check(app, producer, sub["id"])
    times = [r.at for r in bad_receiver.requests]
    assert len(times) == 5
    assert all(later - earlier >= 0.2 - 0.03 for earlier, later in itertools.pairwise(times)), times


@sqlite_only
def test_the_subscriptions_timeout_bounds_each_request(app, producer, bad_receiver):
    sub = producer.subscribe(bad_receiver.url + "/slow/3", attempt_timeout=0.5)
    report = run_check(app, producer, sub["id"])
    rules = by_rule(report)
    assert rules["signed_accepted"]["passed"] is False and "no answer" in rules["signed_accepted"]["detail"]
    assert rules["fast_answer"]["passed"] is False
    assert bad_receiver.count() == 1  # no answer at all: the rest is not sent


@sqlite_only
def test_private_targets_are_refused_unless_allowed(app, producer, bad_receiver):
    sub = producer.subscribe(bad_receiver.url + "/ok")
    app.config["PROMESA_ALLOW_PRIVATE_TARGETS"] = False  # as in production: 127.0.0.1 is never a target
    report = run_check(app, producer, sub["id"])
    rules = by_rule(report)
    assert rules["signed_accepted"]["passed"] is False and "private address refused" in rules["signed_accepted"]["detail"]
    assert rules["https"]["passed"] is False  # loopback is judged when private targets are not allowed
    assert bad_receiver.count() == 0


@sqlite_only
def test_check_true_at_creation_runs_one(app, producer, bad_receiver):
    resp = producer.post("/api/v1/subscriptions", {"url": bad_receiver.url + "/ok", "check": True})
    assert resp.status_code == 201, resp.get_json()
    created = resp.get_json()
    assert created["check_id"].startswith("chk_") and created["secret"].startswith("whsec_")
    run_worker(app)
    report = producer.get(f"/api/v1/checks/{created['check_id']}").get_json()
    assert outcome(report)[0] == {"forged_rejected", "stale_rejected", "tampered_rejected"}
    plain = producer.post("/api/v1/subscriptions", {"url": bad_receiver.url + "/ok"}).get_json()
    assert plain["check_id"] is None  # never run unasked
    assert producer.post("/api/v1/subscriptions", {"url": bad_receiver.url, "check": "yes"}).status_code == 400
    patched = producer.client.patch(f"/api/v1/subscriptions/{plain['id']}", json={"check": True},
                                    headers=producer.headers())
    assert patched.status_code == 400  # not an editable field


@sqlite_only
def test_another_teams_check_does_not_exist(app, client, producer, bad_receiver):
    sub = producer.subscribe(bad_receiver.url + "/ok")
    check_id = producer.post(f"/api/v1/subscriptions/{sub['id']}/checks").get_json()["id"]
    other = Producer(client, team_name="other")
    assert other.get(f"/api/v1/checks/{check_id}").status_code == 404
    assert other.post(f"/api/v1/subscriptions/{sub['id']}/checks").status_code == 404
    assert other.get(f"/api/v1/subscriptions/{sub['id']}/diagnosis").status_code == 404
    assert producer.get("/api/v1/checks/chk_nope").status_code == 404
    producer.client.delete(f"/api/v1/subscriptions/{sub['id']}", headers=producer.headers())
    db.session.execute(Check.__table__.delete())
    db.session.commit()
    deleted = producer.post(f"/api/v1/subscriptions/{sub['id']}/checks")
    assert deleted.status_code == 409


@sqlite_only
def test_the_openapi_document_names_the_check_routes(app, producer):
    doc = producer.get("/api/v1/openapi.json").get_json()
    start = doc["paths"]["/subscriptions/{subscription_id}/checks"]["post"]
    assert set(start["responses"]) >= {"202", "409", "429"}
    assert "/checks/{check_id}" in doc["paths"] and "/subscriptions/{subscription_id}/diagnosis" in doc["paths"]
    check_field = doc["components"]["schemas"]["SubscriptionInput"]["properties"]["check"]
    assert "cannot know the secret" in check_field["description"]
    assert doc["components"]["schemas"]["CheckResult"]["properties"]["rule"]["enum"] == list(ALL_RULES)


@sqlite_only
def test_the_contract_says_never_to_skip_verification_because_of_the_header(app, producer, bad_receiver):
    sub = producer.subscribe(bad_receiver.url + "/ok")
    contract = producer.get(f"/api/v1/subscriptions/{sub['id']}/contract").get_json()
    assert CHECK_HEADER in contract["checks"]
    assert "must not skip verification because of that header" in contract["checks"]


@sqlite_only
def test_a_secret_that_no_longer_decrypts_ends_the_check_with_its_error(app, producer, bad_receiver):
    sub = producer.subscribe(bad_receiver.url + "/ok")
    row = db.session.get(Subscription, sub["id"])
    row.secret_ciphertext = crypto.encrypt(new_secret())[:-4] + "AAAA"  # corrupted at rest
    db.session.commit()
    check_id = producer.post(f"/api/v1/subscriptions/{sub['id']}/checks").get_json()["id"]
    run_worker(app)
    report = producer.get(f"/api/v1/checks/{check_id}").get_json()
    assert report["state"] == "finished" and report["error"].startswith("the check could not run")
    assert bad_receiver.count() == 0
