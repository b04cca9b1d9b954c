"""The receiver check's bounds per team (issue 35): one a minute per team whichever subscription, so
creating and deleting subscriptions does not multiply it; a check dies with its subscription; its own
deadline ends it with what was answered kept; its contract link never comes from the request's Host.
Real receivers on 127.0.0.1 count what was sent."""

from __future__ import annotations

import re
import threading
import time

import pytest
from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.models import Check, Subscription
from dashboard.queue import lanes
from dashboard.subscriptions import checks
from dashboard.subscriptions import service as subscription_service
from tests.operations.test_replays import run_worker

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def subscriptions() -> int:
    return db.session.scalar(select(func.count()).select_from(Subscription))


def report(producer, check_id: str) -> dict:
    db.session.expire_all()
    return producer.get(f"/api/v1/checks/{check_id}").get_json()


def run_in_thread(app, check_id: str) -> threading.Thread:
    """The check's job, as its lane's worker runs it, in a thread with its own app context and session."""
    def job():
        with app.app_context():
            checks.run(check_id, None)

    thread = threading.Thread(target=job)
    thread.start()
    return thread


@sqlite_only
def test_creating_with_check_then_deleting_does_not_get_around_the_teams_limit(app, producer, receiver, clock):
    created = producer.post("/api/v1/subscriptions", {"url": receiver.url + "/ok", "check": True})
    assert created.status_code == 201 and created.get_json()["check_id"]
    gone = producer.client.delete(f"/api/v1/subscriptions/{created.get_json()['id']}", headers=producer.headers())
    assert gone.status_code in (200, 204)
    before = subscriptions()
    again = producer.post("/api/v1/subscriptions", {"url": receiver.url + "/ok", "check": True})
    assert again.status_code == 429, again.get_json()
    assert "at most one a minute per team" in again.get_json()["error"]
    assert 0 < int(again.headers["Retry-After"]) <= 60
    assert subscriptions() == before  # refused before anything was stored
    plain = producer.subscribe(receiver.url + "/ok")
    refused = producer.post(f"/api/v1/subscriptions/{plain['id']}/checks")
    assert refused.status_code == 429 and refused.headers["Retry-After"]
    clock.advance(seconds=61)  # the deleted subscription's check ended (deleted): a minute later, one may start
    assert producer.post(f"/api/v1/subscriptions/{plain['id']}/checks").status_code == 202
    assert db.session.scalar(select(func.count()).select_from(Check)) == 2


@sqlite_only
def test_a_check_whose_subscription_was_deleted_before_it_ran_sends_nothing(app, producer, receiver):
    sub = producer.subscribe(receiver.url + "/ok")
    check_id = producer.post(f"/api/v1/subscriptions/{sub['id']}/checks").get_json()["id"]
    producer.client.delete(f"/api/v1/subscriptions/{sub['id']}", headers=producer.headers())
    run_worker(app)
    assert receiver.count() == 0
    ended = report(producer, check_id)
    assert ended["state"] == "finished" and "deleted" in ended["error"], ended


@sqlite_only
def test_a_check_whose_subscription_is_deleted_mid_run_sends_no_further_request(app, producer, receiver):
    sub = producer.subscribe(receiver.url + "/slow/1")
    check_id = producer.post(f"/api/v1/subscriptions/{sub['id']}/checks").get_json()["id"]
    job = run_in_thread(app, check_id)
    assert receiver.wait_for(1, timeout=10)  # the first request is being answered
    deleted = producer.client.delete(f"/api/v1/subscriptions/{sub['id']}", headers=producer.headers())
    assert deleted.status_code in (200, 204)
    job.join(timeout=30)
    assert not job.is_alive()
    assert receiver.count() == 1
    ended = report(producer, check_id)
    assert ended["state"] == "finished" and "stopped: its subscription was deleted" == ended["error"], ended


@sqlite_only
def test_disabling_the_subscription_ends_its_check(app, producer, receiver):
    sub = producer.subscribe(receiver.url + "/slow/1")
    check_id = producer.post(f"/api/v1/subscriptions/{sub['id']}/checks").get_json()["id"]
    job = run_in_thread(app, check_id)
    assert receiver.wait_for(1, timeout=10)
    subscription_service.disable(db.session.get(Subscription, sub["id"]), "receiver moved")
    job.join(timeout=30)
    assert receiver.count() == 1
    assert report(producer, check_id)["error"] == "stopped: its subscription was disabled"


@sqlite_only
def test_the_checks_deadline_ends_it_and_keeps_what_was_answered(app, producer, receiver, clock):
    app.config["PROMESA_CHECK_DEADLINE_SECONDS"] = 2.5
    slow = producer.subscribe(receiver.url + "/slow/1")  # five answers of 1 s each: more than 2.5 s
    check_id = producer.post(f"/api/v1/subscriptions/{slow['id']}/checks").get_json()["id"]
    started = time.monotonic()
    run_in_thread(app, check_id).join()
    assert time.monotonic() - started < 2.5 + 2
    ended = report(producer, check_id)
    stopped = re.fullmatch(r"stopped after (\d) of 5 requests: the check's 2.5 s ran out \(the endpoint answers "
                           r"too slowly for all of it\)", ended["error"] or "")
    assert ended["state"] == "finished" and stopped, ended
    answered = int(stopped.group(1))
    assert 1 <= answered < 5 and receiver.count() in (answered, answered + 1)  # one more, cut short by the deadline
    marks = {r["rule"]: r["passed"] for r in ended["results"]}
    assert marks["signed_accepted"] is True and marks["fast_answer"] is True  # what was answered is kept
    assert marks["tampered_rejected"] is None  # never sent

    clock.advance(seconds=61)
    app.config["PROMESA_CHECK_DEADLINE_SECONDS"] = 1.0
    hangs = producer.subscribe(receiver.url + "/slow/20")  # within its 10 s attempt timeout: it hangs
    check_id = producer.post(f"/api/v1/subscriptions/{hangs['id']}/checks").get_json()["id"]
    started = time.monotonic()
    run_in_thread(app, check_id).join()
    assert time.monotonic() - started < 1.0 + 2
    ended = report(producer, check_id)
    assert ended["error"] == "stopped after 0 of 5 requests: the check's 1 s ran out (the endpoint answers too " \
                             "slowly for all of it)", ended
    assert [r["passed"] for r in ended["results"]][:3] == [None, None, None]


@sqlite_only
def test_the_contract_link_is_at_the_base_url_whatever_the_host_header(app, producer, receiver):
    app.config["PROMESA_BASE_URL"] = "https://promesa.example.com"
    sub = producer.subscribe(receiver.url + "/ok")  # accepts forgeries: the advice links the contract
    started = producer.client.post(f"/api/v1/subscriptions/{sub['id']}/checks", headers={
        **producer.headers(), "Host": "attacker.example", "X-Forwarded-Host": "attacker.example"})
    assert started.status_code == 202
    run_worker(app)
    advice = " ".join(r["advice"] or "" for r in report(producer, started.get_json()["id"])["results"])
    assert f"https://promesa.example.com/subscriptions/{sub['id']}/contract" in advice
    assert "attacker.example" not in advice


@sqlite_only
def test_check_jobs_go_to_the_checks_lane(app, producer, receiver):
    sub = producer.subscribe(receiver.url + "/ok")
    check_id = producer.post(f"/api/v1/subscriptions/{sub['id']}/checks").get_json()["id"]
    assert lanes.queue("checks", app).job_ids == [f"check-{check_id}"]


@sqlite_only
def test_the_page_refuses_a_second_check_of_the_team_with_429(app, client, auth, producer, receiver, users):
    first, second = producer.subscribe(receiver.url + "/ok"), producer.subscribe(receiver.url + "/ok")
    auth.login("owner")
    started = client.post(f"/subscriptions/{first['id']}/checks", data={"csrf_token": auth.csrf()})
    assert started.status_code == 302
    refused = client.post(f"/subscriptions/{second['id']}/checks", data={"csrf_token": auth.csrf()})
    assert refused.status_code == 429 and 0 < int(refused.headers["Retry-After"]) <= 60
    assert "at most one a minute per team" in refused.get_data(as_text=True)
