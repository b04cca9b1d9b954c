"""What an operator reads and does in an outage (issue 29): the subscription page's current state, its chart
windows with latency, the response headers of each attempt, the next-attempt column, separate pause and
disable reasons, replays of a paused subscription that say they are held, discard and give up, the
confirmations, and the API's discards and give-up."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from sqlalchemy import select, update

from dashboard.core.extensions import db
from dashboard.delivery import http
from dashboard.models import Attempt, AuditEntry, Delivery, Incident, Replay, Subscription
from dashboard.web import charts

from tests.support import pipeline

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


def failing(app, producer, receiver, clock, path="/status/503", events=2):
    """A subscription whose receiver answers `path`, with `events` deliveries tried once and scheduled."""
    sub = producer.subscribe(receiver.url + path)
    for _ in range(events):
        producer.publish()
    pipeline.deliver_due(app, clock)
    return sub


def with_dead_letters(app, producer, receiver, clock, events=1):
    """A subscription answering 400, and `events` dead letters killed by the real pipeline (three attempts)."""
    sub = producer.subscribe(receiver.url + "/status/400")
    for _ in range(events):
        producer.publish()
    for _ in range(3):
        pipeline.deliver_due(app, clock)
        clock.advance(hours=1)
    return sub


def test_the_page_says_what_is_wrong_since_when_and_what_fits(app, client, auth, producer, receiver, users, clock):
    sub = failing(app, producer, receiver, clock)
    # The receiver's own words, which must reach the page as text, never as markup.
    db.session.execute(update(Attempt).values(response_excerpt="<b>upstream down</b>"))
    now = clock.now()
    incident = Incident(subscription_id=sub["id"], team_id=producer.team.id, rule="failure_rate", state="open",
                        opened_at=now, first_seen_at=now, last_seen_at=now, figures={})
    db.session.add(incident)
    db.session.commit()
    clock.advance(minutes=3)
    auth.login("operator")
    html = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    top = html.split('id="current-state"')[1].split("</section>")[0]
    assert "HTTP 503 (server error)" in top
    assert "&lt;b&gt;upstream down&lt;/b&gt;" in top and "<b>upstream down" not in top
    failing_since = re.search(r'class="failing-since">([^<]+)<', top).group(1)
    assert failing_since.startswith(now.strftime("%Y-%m-%d %H:%M") + " UTC (3 min ago)")
    assert f'href="/incidents/{incident.id}"' in top and "failure rate" in top
    next_retry = db.session.scalar(select(Delivery.next_attempt_at).order_by(Delivery.next_attempt_at))
    assert f"{next_retry:%Y-%m-%d %H:%M:%S} UTC" in re.search(r'class="next-retry">(.+?)</dd>', top).group(1)
    assert "2 scheduled" in top
    assert "pause it (below)" in top  # failing and active: the action that fits is a pause

    csrf = auth.csrf()
    client.post(f"/subscriptions/{sub['id']}/pause", data={"csrf_token": csrf, "reason": "vendor <outage>"})
    html = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    top = html.split('id="current-state"')[1].split("</section>")[0]
    assert "Paused by operator@example.com" in top and "vendor &lt;outage&gt;" in top
    assert "2 deliveries are held until you resume it" in top
    assert "Resume and send the 2 held" in top  # now the action that fits is resume
    entry = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "subscription.paused"))
    assert entry.detail == {"reason": "vendor <outage>"} and entry.deliveries == 2
    audit_page = client.get("/audit").get_data(as_text=True)
    assert "reason: vendor &lt;outage&gt;" in audit_page


def test_pause_and_disable_each_keep_their_own_reason(app, client, auth, producer, receiver, users):
    sub = producer.subscribe(receiver.url + "/ok")
    auth.login("operator")
    html = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    pause_form = re.search(r'<form[^>]+/pause"[^>]*>(.+?)</form>', html, re.S).group(1)
    disable_form = re.search(r'<form[^>]+/disable"[^>]*>(.+?)</form>', html, re.S).group(1)
    assert 'name="reason"' in pause_form and 'name="reason"' in disable_form  # one box each, in its own form
    csrf = auth.csrf()
    assert client.post(f"/subscriptions/{sub['id']}/pause",
                       data={"csrf_token": csrf, "reason": "x" * 501}).status_code == 400
    client.post(f"/subscriptions/{sub['id']}/pause", data={"csrf_token": csrf})  # a pause needs no reason
    db.session.expire_all()
    assert db.session.get(Subscription, sub["id"]).state == "paused"
    assert db.session.get(Subscription, sub["id"]).state_reason is None
    client.post(f"/subscriptions/{sub['id']}/disable", data={"csrf_token": csrf, "reason": "moving hosts"})
    db.session.expire_all()
    details = db.session.scalars(select(AuditEntry.detail).where(AuditEntry.action.like("subscription.%"))
                                 .order_by(AuditEntry.id)).all()
    assert details[-2:] == [None, {"reason": "moving hosts"}]


@pytest.mark.parametrize("window, buckets", [("1h", 60), ("24h", 96), ("7d", 168)])
def test_each_chart_window_has_its_buckets_and_no_label_runs_off(app, client, auth, producer, receiver, users,
                                                                  clock, window, buckets):
    sub = failing(app, producer, receiver, clock, events=1)
    auth.login("member")
    html = client.get(f"/subscriptions/{sub['id']}?window={window}").get_data(as_text=True)
    assert f'aria-current="page">{charts_title(window)}</a>' in html
    drawn = re.findall(r'<svg class="chart bars (chart-wide|chart-compact)"(.*?)</svg>', html, re.S)
    assert [fit for fit, _ in drawn] == ["chart-wide", "chart-compact"]  # for a desktop, and for a phone
    for _, svg in drawn:
        width = int(re.search(r'width="(\d+)"', svg).group(1))
        bar = re.search(r'<path class="fail" d="M([\d.]+) [\d.]+h([\d.]+)', svg)
        assert float(bar.group(2)) == pytest.approx(max((width - 52) / buckets - 1, 1), abs=0.01)
        for x, anchor, label in re.findall(
                r'<text class="tick" x="([\d.]+)" y="\d+" text-anchor="(start|end)">([^<]+)<', svg):
            if anchor == "start":
                assert float(x) + len(label) * charts.TICK_CHAR_PX <= width, label
            else:
                assert float(x) <= width and float(x) - len(label) * charts.TICK_CHAR_PX >= 0, label


def charts_title(window):
    from dashboard.web.pages.subscriptions import WINDOWS

    return WINDOWS[window].title


def test_a_window_that_does_not_exist_is_a_400(app, client, auth, producer, receiver, users):
    sub = producer.subscribe(receiver.url + "/ok")
    auth.login("member")
    resp = client.get(f"/subscriptions/{sub['id']}?window=2y")
    assert resp.status_code == 400 and "window must be one of: 1h, 24h, 7d" in resp.get_data(as_text=True)


def test_latency_shows_the_median_and_the_95th_percentile(app, client, auth, producer, receiver, users, clock):
    from dashboard.stats import latency

    sub = failing(app, producer, receiver, clock, events=20)
    durations = list(range(10, 210, 10))  # 10 .. 200 ms
    for attempt_id, ms in zip(db.session.scalars(select(Attempt.id).order_by(Attempt.id)), durations):
        db.session.execute(update(Attempt).where(Attempt.id == attempt_id).values(duration_ms=ms))
    db.session.commit()
    minute = clock.now().replace(second=0, microsecond=0)
    found, cut = latency.per_bucket(db.session, sub["id"], [minute - dt.timedelta(minutes=1), minute], 60,
                                    minute + dt.timedelta(minutes=1), 86400)
    assert not cut and found[0].count == 0 and found[0].p50 is None
    assert (found[1].count, found[1].p50, found[1].p95) == (20, 100, 190)
    auth.login("member")
    html = client.get(f"/subscriptions/{sub['id']}?window=1h").get_data(as_text=True)
    lines = html.split('<svg class="chart lines chart-wide"')[1].split("</svg>")[0]
    assert '>190</text>' in lines  # the y axis tops at the largest p95
    assert 'class="line p50"' in lines and 'class="line p95"' in lines


def test_each_attempt_keeps_the_response_headers_escaped_and_bounded(app, client, auth, producer, receiver,
                                                                     users, clock):
    sub = failing(app, producer, receiver, clock, path="/ratelimit/7", events=1)
    attempt = db.session.scalar(select(Attempt))
    assert "Retry-After: 7" in attempt.response_headers.splitlines()
    db.session.execute(update(Attempt).values(response_headers=attempt.response_headers + "\nX-Evil: <script>x</script>"))
    db.session.commit()
    auth.login("member")
    html = client.get(f"/deliveries/{attempt.delivery_id}").get_data(as_text=True)
    assert "Retry-After: 7" in html and "X-Evil: &lt;script&gt;x&lt;/script&gt;" in html and "<script>x" not in html
    assert '<th>Next attempt (UTC)</th>' in client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)

    many = tuple((f"X-H{i}".encode(), b"v" * 100) for i in range(100))
    kept = http.headers_text(many)
    assert len(kept.encode()) <= http.RESPONSE_HEADERS_BYTES and kept.endswith("[more headers not kept]")
    assert kept.splitlines()[0] == "X-H0: " + "v" * 100
    assert http.headers_text(((b"X-Nul", b"a\x00b\xff"),)) == "X-Nul: ab\ufffd"


def test_the_delivery_list_says_when_each_is_next_tried(app, client, auth, producer, receiver, users, clock):
    sub = failing(app, producer, receiver, clock, events=1)
    due = db.session.scalar(select(Delivery.next_attempt_at))
    auth.login("member")
    html = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    row = html.split("<h2>Deliveries</h2>")[1].split("</tbody>")[0]
    assert f'<td data-label="Next attempt (UTC)">{due:%Y-%m-%d %H:%M:%S}</td>' in row
    producer.post(f"/api/v1/subscriptions/{sub['id']}/pause")
    row = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True).split("<h2>Deliveries</h2>")[1]
    assert "held until resumed" in row.split("</tbody>")[0]


def test_the_replay_button_of_a_paused_subscription_says_they_are_held(app, client, auth, producer, receiver,
                                                                       users, clock):
    sub = with_dead_letters(app, producer, receiver, clock)
    producer.post(f"/api/v1/subscriptions/{sub['id']}/pause")
    auth.login("operator")
    html = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    replay_form = re.search(r'<form[^>]+/replay"[^>]*>', html.split('<div class="actions">')[-1])
    assert "They will be held until you resume it." in replay_form.group(0)  # said before
    client.post(f"/subscriptions/{sub['id']}/replay", data={"csrf_token": auth.csrf()})
    flash = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    assert "Replaying 1 dead delivery. The subscription is paused: they are held until you resume it" in flash
    assert db.session.scalar(select(Delivery.state)) == "held"


def test_destructive_and_wide_actions_ask_first(app, client, auth, producer, receiver, users, clock):
    sub = with_dead_letters(app, producer, receiver, clock)
    auth.login("admin")
    html = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    for action, question in [("/replay", "Replay all 1 dead letters"), ("/discard", "Discard all 1 dead letters"),
                             ("/rotate-secret", "Rotate the signing secret?"), ("/delete", "Delete this subscription?")]:
        form = re.search(rf'<form[^>]+action="/subscriptions/{sub["id"]}{action}"[^>]*>', html)
        assert form and f'data-confirm="{question}' in form.group(0), action
    desk = client.get("/dead-letters").get_data(as_text=True)
    assert 'data-confirm="Replay the 1 matching dead letters?"' in desk
    assert 'data-confirm="Discard the selected dead letters?' in desk and 'data-confirm-count="delivery_id"' in desk
    tokens = client.get(f"/tokens?team={producer.team.id}").get_data(as_text=True)
    assert 'data-confirm="Revoke token' in tokens
    assert '<script src="/static/confirm.js" defer></script>' in html
    assert "onclick" not in html and "onsubmit" not in html  # the CSP allows no inline handlers


def test_discard_from_the_page_and_the_desk_and_give_up(app, client, auth, producer, receiver, users, clock):
    from tests.operations.test_replays import run_worker

    app.config["PROMESA_DRAIN_LINGER_SECONDS"] = 0.0
    sub = with_dead_letters(app, producer, receiver, clock, 3)
    dead = db.session.scalars(select(Delivery.id).order_by(Delivery.id)).all()
    auth.login("operator")
    csrf = auth.csrf()
    resp = client.post(f"/subscriptions/{sub['id']}/discard", data={"csrf_token": csrf, "delivery_id": dead[0]})
    assert resp.status_code == 302 and "/replays/rpl_" in resp.headers["Location"]
    resp = client.post("/dead-letters/discard", data={"csrf_token": csrf, "which": "selected",
                                                      "delivery_id": dead[1]})
    assert resp.status_code == 302
    run_worker(app)
    states = dict(db.session.execute(select(Delivery.id, Delivery.state)).all())
    assert [states[i] for i in dead] == ["discarded", "discarded", "dead"]
    page = client.get(resp.headers["Location"]).get_data(as_text=True)
    assert "1</strong> of <strong class=\"replay-total\">1</strong> dead letters discarded" in page
    assert client.get(f"/deliveries/{dead[0]}").status_code == 200  # still readable
    listed = client.get(f"/subscriptions/{sub['id']}?state=discarded").get_data(as_text=True)
    assert listed.count('<span class="state state-discarded">discarded</span>') == 2
    entries = db.session.execute(select(AuditEntry.action, AuditEntry.deliveries)
                                 .where(AuditEntry.action.like("discard.%")).order_by(AuditEntry.id)).all()
    assert sorted(entries) == [("discard.finished", 1)] * 2 + [("discard.started", 1)] * 2

    scheduled = failing(app, producer, receiver, clock, events=2)
    resp = client.post(f"/subscriptions/{scheduled['id']}/give-up", data={"csrf_token": csrf})
    assert resp.status_code == 302
    rows = db.session.execute(select(Delivery.state, Delivery.dead_lettered_at, Delivery.next_attempt_at)
                              .where(Delivery.subscription_id == scheduled["id"])).all()
    assert [(r.state, r.dead_lettered_at, r.next_attempt_at) for r in rows] == [("dead", clock.now(), None)] * 2
    given = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "deliveries.given_up"))
    assert given.deliveries == 2 and given.actor == "operator@example.com"
    auth.login("member")
    assert client.post(f"/subscriptions/{scheduled['id']}/give-up",
                       data={"csrf_token": auth.csrf()}).status_code == 403


def test_the_api_discards_and_gives_up(app, producer, receiver, clock):
    from tests.operations.test_replays import run_worker

    app.config["PROMESA_DRAIN_LINGER_SECONDS"] = 0.0
    sub = with_dead_letters(app, producer, receiver, clock, 2)
    resp = producer.post(f"/api/v1/subscriptions/{sub['id']}/discards", {})
    assert resp.status_code == 202 and resp.get_json()["total"] == 2
    run_worker(app)
    job = producer.get(f"/api/v1/replays/{resp.get_json()['id']}").get_json()
    assert (job["kind"], job["state"], job["discarded"], job["done"]) == ("discard", "finished", 2, 2)
    assert producer.post(f"/api/v1/subscriptions/{sub['id']}/discards",
                         {"delivery_ids": ["dlv_x"] * 501}).status_code == 400

    other = failing(app, producer, receiver, clock, events=1)
    resp = producer.post(f"/api/v1/subscriptions/{other['id']}/give-up", {})
    assert resp.status_code == 200 and resp.get_json() == {"given_up": 1}
    assert producer.post(f"/api/v1/subscriptions/{other['id']}/give-up", {}).get_json() == {"given_up": 0}
    producer.client.delete(f"/api/v1/subscriptions/{other['id']}", headers=producer.headers())
    assert producer.post(f"/api/v1/subscriptions/{other['id']}/discards", {}).status_code == 409
    spec = producer.get("/api/v1/openapi.json").get_json()
    assert "/subscriptions/{subscription_id}/discards" in spec["paths"]
    assert "discarded" in spec["components"]["schemas"]["Delivery"]["properties"]["state"]["enum"]
    assert db.session.scalar(select(Replay.kind).where(Replay.id == job["id"])) == "discard"


def test_the_api_says_a_replay_of_a_paused_subscription_is_held_before_and_after(app, producer, receiver, clock):
    from tests.operations.test_replays import run_worker

    app.config["PROMESA_DRAIN_LINGER_SECONDS"] = 0.0
    sub = with_dead_letters(app, producer, receiver, clock, 2)
    producer.post(f"/api/v1/subscriptions/{sub['id']}/pause")
    started = producer.post(f"/api/v1/subscriptions/{sub['id']}/replays", {})
    assert started.status_code == 202 and started.get_json()["held_until_resume"] is True
    run_worker(app)
    job = producer.get(f"/api/v1/replays/{started.get_json()['id']}").get_json()
    assert (job["state"], job["progress"], job["held"], job["sent"], job["waiting"]) == \
        ("finished", "held until resume", 2, 0, 0)
    producer.post(f"/api/v1/subscriptions/{sub['id']}/resume")
    again = producer.post(f"/api/v1/subscriptions/{sub['id']}/replays", {})
    assert again.get_json()["held_until_resume"] is False


def test_the_api_pauses_with_a_reason(app, producer, receiver):
    sub = producer.subscribe(receiver.url + "/ok")
    paused = producer.post(f"/api/v1/subscriptions/{sub['id']}/pause", {"reason": "vendor maintenance"})
    assert paused.status_code == 200 and paused.get_json()["state_reason"] == "vendor maintenance"
    assert producer.post(f"/api/v1/subscriptions/{sub['id']}/pause", {"reason": "x" * 501}).status_code == 400
    entry = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "subscription.paused"))
    assert entry.detail == {"reason": "vendor maintenance"} and entry.actor_kind == "token"
