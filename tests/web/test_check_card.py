"""The receiver check on the dashboard: the report card on the subscription page (escaped), the button
(owners, operators, admins; POST with CSRF), the card's poll while a check runs, the overview's mark
for a failed check, and the diagnosis groups on the page."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from tests.operations.test_replays import run_worker
from tests.sdk.conftest import wrong_secret_receiver  # noqa: F401  (fixture)
from tests.support.pipeline import deliver_due
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]
BUTTON = "Run receiver check"


class HostileRedirect(Receiver):
    """Redirects with a Location that is markup: the card must show it as text."""

    def behaviour(self, path: str, n: int) -> tuple[int, dict]:
        return 301, {"Location": '/final?x="><script>alert(1)</script>'}


def card(html: str) -> str:
    match = re.search(r'<section id="receiver-check".*?</section>', html, re.DOTALL)
    assert match, "no report card on the page"
    return match.group(0)


def test_owners_run_a_check_and_everyone_of_the_team_reads_the_report(app, client, auth, producer, receiver, users,
                                                                      clock):
    sub = producer.subscribe(receiver.url + "/ok")
    page = f"/subscriptions/{sub['id']}"
    auth.login("member")
    first = card(client.get(page).get_data(as_text=True))
    assert "No check has run yet" in first and BUTTON not in first
    assert client.post(f"{page}/checks", data={"csrf_token": auth.csrf()}).status_code == 403

    auth.login("owner")
    assert BUTTON in card(client.get(page).get_data(as_text=True))
    assert client.post(f"{page}/checks", data={}).status_code == 400  # no CSRF token: refused
    started = client.post(f"{page}/checks", data={"csrf_token": auth.csrf()})
    assert started.status_code == 302 and started.headers["Location"].endswith(f"{page}#receiver-check")
    html = client.get(page).get_data(as_text=True)
    running = card(html)
    assert "is running" in running and "hx-get" in running and BUTTON not in running
    check_id = re.search(r"Check <code>(chk_\w+)</code>", running).group(1)
    assert "Receiver check " + check_id + " started" in html  # the flash
    again = client.post(f"{page}/checks", data={"csrf_token": auth.csrf()}, follow_redirects=True)
    assert "at most one a minute" in again.get_data(as_text=True)  # the 429, said on the page

    run_worker(app)
    for role in ("member", "oncall"):
        auth.login(role)
        polled = client.get(f"{page}/checks/{check_id}").get_data(as_text=True)
        assert "hx-get" not in polled and BUTTON not in polled  # finished: no more polling; reading only
        assert "4 passed" in polled and "3 failed" in polled and "1 not judged" in polled
        rows = dict(re.findall(r'data-rule="(\w+)">\s*<td data-label="Result"><span class="[\w-]+">([\w ]+)</span>',
                               polled))
        assert rows["forged_rejected"] == "fail" and rows["signed_accepted"] == "pass" and rows["https"] == "not judged"
        assert "verify X-Signature over the raw body" in polled
        assert f'href="/subscriptions/{sub["id"]}/contract#snippet-python"' in polled
        assert "promesa_receiver.verify</code>" in polled


def test_the_card_escapes_what_the_receiver_said(app, client, auth, producer, users):
    with HostileRedirect() as hostile:
        sub = producer.subscribe(hostile.url + "/hook")
        producer.post(f"/api/v1/subscriptions/{sub['id']}/checks")
        run_worker(app)
    auth.login("owner")
    shown = card(client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True))
    assert "<script>alert(1)</script>" not in shown
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown  # the Location to register, as text
    assert "fail" in shown


def test_a_wrong_secret_is_blamed_on_the_signature_and_each_rule_shows_its_answer(
        app, client, auth, producer, users, wrong_secret_receiver):  # noqa: F811
    sub = producer.subscribe(wrong_secret_receiver.url)  # the receiver verifies with a secret of its own
    producer.post(f"/api/v1/subscriptions/{sub['id']}/checks")
    run_worker(app)
    auth.login("owner")
    shown = card(client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True))
    rows = dict(re.findall(r'data-rule="(\w+)">(.*?)</tr>', shown, re.DOTALL))
    assert '<span class="bad">fail</span>' in rows["signed_accepted"]
    assert "most likely the signature check" in rows["signed_accepted"]
    for rule in ("duplicate_accepted", "forged_rejected", "stale_rejected", "tampered_rejected"):
        assert '<span class="muted">not judged</span>' in rows[rule]
        assert "the correctly signed event was not accepted" in rows[rule]
        assert "Dedupe" not in rows[rule]  # no advice about deduplication for a refused signature
    for rule in ("signed_accepted", "duplicate_accepted", "forged_rejected"):
        assert "HTTP 401" in rows[rule]  # the answer beside the verdict, escaped
        assert "&lt;script&gt;alert(&#34;refused&#34;)&lt;/script&gt; signature mismatch" in rows[rule]
    assert "<script>alert" not in shown
    assert "HTTP" not in rows["https"]  # judged on the URL, no answer to show


def test_the_overview_marks_subscriptions_whose_last_check_failed(app, client, auth, producer, receiver, users, clock):
    careless = producer.subscribe(receiver.url + "/ok", description="careless")
    unchecked = producer.subscribe(receiver.url + "/ok", description="unchecked")
    producer.post(f"/api/v1/subscriptions/{careless['id']}/checks")
    run_worker(app)
    auth.login("oncall")
    html = client.get("/").get_data(as_text=True)
    rows = {row_id: row for row_id, row in ((sub["id"], re.search(
        rf'<tr class="severity-\d+">\s*<td><a href="/subscriptions/{sub["id"]}".*?</tr>', html, re.DOTALL).group(0))
        for sub in (careless, unchecked))}
    assert "receiver check failed" in rows[careless["id"]]
    assert "receiver check failed" not in rows[unchecked["id"]]


def test_the_page_shows_the_diagnosis_groups(app, client, auth, producer, receiver, users, clock):
    sub = producer.subscribe(receiver.url + "/status/429")
    producer.publish()
    deliver_due(app, clock)
    auth.login("member")
    html = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    section = re.search(r'<section id="diagnosis".*?</section>', html, re.DOTALL).group(0)
    assert 'data-cause="rate_limited"' in section and "set a rate limit on this subscription" in section


def test_only_the_latest_finished_check_counts_for_the_mark(app, producer, receiver, clock):
    from dashboard.core.extensions import db
    from dashboard.models import Check
    from dashboard.subscriptions import checks

    fail = [{"rule": "forged_rejected", "passed": False, "detail": "d", "advice": "a"}]
    passed = [{"rule": "forged_rejected", "passed": True, "detail": "d", "advice": ""}]
    mended, broke, running = (producer.subscribe(receiver.url + "/ok")["id"] for _ in range(3))
    now = clock.now()
    for n, (sub, results) in enumerate([(mended, fail), (mended, passed), (broke, passed), (broke, fail),
                                        (running, fail)]):
        at = now - dt.timedelta(hours=10 - n)
        db.session.add(Check(id=f"chk_{n}", subscription_id=sub, state="finished", started_at=at, finished_at=at,
                             results=results, requested_by="owner@example.com"))
    db.session.add(Check(id="chk_running", subscription_id=running, state="running", started_at=now,
                         requested_by="owner@example.com"))  # not finished: the one before still counts
    db.session.commit()
    assert checks.latest_failed([mended, broke, running]) == {broke, running}
