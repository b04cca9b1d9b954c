"""The dead-letters page, the replay pages, "replay since" on a subscription, and the replay API."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Delivery, Replay, Subscription

from tests.conftest import Producer
from tests.operations.test_replays import make_dead, run_worker, states

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@pytest.fixture(autouse=True)
def _quick_drains(app):
    app.config["PROMESA_DRAIN_LINGER_SECONDS"] = 0.0


@pytest.fixture
def dead(app, client, producer, receiver, clock, users):
    """acme: three dead 400s of file.updated, one dead 404 of order.paid; team other: one dead 400."""
    a, dead_a = make_dead(app, clock, producer, receiver, 400, ["file.updated"] * 3)
    b, dead_b = make_dead(app, clock, producer, receiver, 404, ["order.paid"])
    o, dead_o = make_dead(app, clock, Producer(client, "other"), receiver, 400, ["file.updated"])
    return {"a": (a, dead_a), "b": (b, dead_b), "other": (o, dead_o)}


def matching(html: str) -> int:
    return int(re.search(r'<strong id="matching">(\d+)</strong>', html).group(1))


def test_it_lists_and_counts_what_the_filter_matches(client, auth, dead):
    auth.login("operator")
    assert matching(client.get("/dead-letters").get_data(as_text=True)) == 5
    html = client.get(f"/dead-letters?subscription={dead['a'][0]}").get_data(as_text=True)
    assert matching(html) == 3 and all(d in html for d in dead["a"][1]) and not any(d in html for d in dead["b"][1])
    assert matching(client.get("/dead-letters?event_type=order.paid").get_data(as_text=True)) == 1
    assert matching(client.get("/dead-letters?result=4xx").get_data(as_text=True)) == 5
    assert matching(client.get("/dead-letters?result=404").get_data(as_text=True)) == 1
    html = client.get("/dead-letters").get_data(as_text=True)
    assert "Replay the 5 matching" in html and "Replay selected" in html


def test_it_pages_newest_first(client, auth, dead, monkeypatch):
    from dashboard.web.pages import dead_letters

    monkeypatch.setattr(dead_letters, "PAGE", 2)
    auth.login("operator")
    seen, url = [], "/dead-letters"
    while url:
        html = client.get(url).get_data(as_text=True)
        seen += re.findall(r'name="delivery_id" value="([^"]+)"', html)
        nxt = re.search(r'href="(/dead-letters\?before=[^"]+)">Older', html)
        url = nxt.group(1).replace("&amp;", "&") if nxt else None
    everything = {**dead["a"][1], **dead["b"][1], **dead["other"][1]}
    assert sorted(seen) == sorted(everything) and len(seen) == 5


def test_bad_filters_say_what_is_wrong(client, auth, dead):
    auth.login("operator")
    resp = client.get("/dead-letters?since=yesterday")
    assert resp.status_code == 400 and "since must be an ISO 8601 time" in resp.get_data(as_text=True)
    resp = client.get("/dead-letters?since=2026-01-02T00:00&until=2026-01-01T00:00")
    assert resp.status_code == 422 and "since must be before until" in resp.get_data(as_text=True)
    assert client.get("/dead-letters?team=acme").status_code == 400


@pytest.mark.parametrize("role", ["oncall", "member"])
def test_readers_see_the_page_without_buttons(client, auth, dead, role):
    auth.login(role)
    html = client.get("/dead-letters").get_data(as_text=True)
    assert matching(html) == (5 if role == "oncall" else 4)  # a member sees its own team's
    assert "Replay the" not in html and "Replay selected" not in html and 'type="checkbox"' not in html


def test_an_owner_sees_and_replays_its_own_team_only(client, auth, dead):
    auth.login("owner")
    html = client.get("/dead-letters").get_data(as_text=True)
    assert matching(html) == 4 and "Replay the 4 matching" in html
    assert not any(d in html for d in dead["other"][1])
    other_team = db.session.scalar(select(Subscription.team_id).where(Subscription.id == dead["other"][0]))
    resp = client.get(f"/dead-letters?team={other_team}")  # another team's letters: none to see, none to replay
    assert resp.status_code == 200 and matching(resp.get_data(as_text=True)) == 0
    assert "Replay the" not in resp.get_data(as_text=True)


def test_the_progress_partial_polls_until_the_replay_is_over(app, client, auth, dead, receiver):
    auth.login("operator")
    resp = client.post("/dead-letters/replay", data={"csrf_token": auth.csrf("/dead-letters"), "which": "matching",
                                                     "subscription": dead["b"][0]})
    progress = resp.headers["Location"]
    replay_id = progress.rsplit("/", 1)[1]
    partial = client.get(progress, headers={"HX-Request": "true"}).get_data(as_text=True)
    assert 'hx-trigger="load delay:500ms"' in partial and "<progress" in partial and "<html" not in partial
    assert "Cancel this replay" in partial
    # A second click with the same filter lands on the same replay.
    again = client.post("/dead-letters/replay", data={"csrf_token": auth.csrf("/dead-letters"), "which": "matching",
                                                      "subscription": dead["b"][0]})
    assert again.headers["Location"] == progress
    run_worker(app)  # re-queued, and delivered (to the still-failing 404: it is retried, on its way)
    partial = client.get(progress, headers={"HX-Request": "true"}).get_data(as_text=True)
    assert 'hx-trigger="load delay:2s"' in partial and "Cancel" not in partial
    assert '<progress max="1" value="1">' in partial
    db.session.execute(Delivery.__table__.update().where(Delivery.replay_id == replay_id).values(state="succeeded"))
    db.session.commit()
    partial = client.get(progress, headers={"HX-Request": "true"}).get_data(as_text=True)
    assert "hx-trigger" not in partial  # over, and every outcome is in: polling stops
    assert '<span class="replay-succeeded">1</span>' in partial
    assert replay_id in client.get("/replays").get_data(as_text=True)


def test_an_operator_cancels_from_the_page(app, client, auth, dead):
    auth.login("operator")
    resp = client.post("/dead-letters/replay", data={"csrf_token": auth.csrf("/dead-letters"), "which": "matching"})
    progress = resp.headers["Location"]
    resp = client.post(progress + "/cancel", data={"csrf_token": auth.csrf("/dead-letters")}, follow_redirects=True)
    assert "Cancelled after 0 of 5" in resp.get_data(as_text=True)
    run_worker(app)
    everything = {**dead["a"][1], **dead["b"][1], **dead["other"][1]}
    assert set(states(everything).values()) == {"dead"}
    assert db.session.scalar(select(AuditEntry.actor).where(AuditEntry.action == "replay.cancelled")) \
        == "operator@example.com"


def test_replay_since_from_the_subscription_page(app, client, auth, dead, clock):
    sub_a, dead_a = dead["a"]
    auth.login("owner")
    page = client.get(f"/subscriptions/{sub_a}").get_data(as_text=True)
    assert 'type="datetime-local" name="since"' in page and "(UTC)" in page
    later = clock.now().strftime("%Y-%m-%dT%H:%M")
    resp = client.post(f"/subscriptions/{sub_a}/replays", data={"csrf_token": auth.csrf(), "since": later})
    replay = db.session.get(Replay, resp.headers["Location"].rsplit("/", 1)[1])
    assert replay.total == 0  # nothing died after that minute
    resp = client.post(f"/subscriptions/{sub_a}/replays", data={"csrf_token": auth.csrf(), "since": "2000-01-01T00:00"})
    replay = db.session.get(Replay, resp.headers["Location"].rsplit("/", 1)[1])
    assert replay.total == 3 and replay.subscription_id == sub_a
    bad = client.post(f"/subscriptions/{sub_a}/replays", data={"csrf_token": auth.csrf(), "since": "soon"})
    assert bad.status_code == 400
    member_page = client.get(f"/subscriptions/{sub_a}")
    assert member_page.status_code == 200


def test_the_replay_api(app, producer, dead, receiver):
    sub_a, dead_a = dead["a"]
    resp = producer.post(f"/api/v1/subscriptions/{sub_a}/replays", {"event_types": ["file.updated"],
                                                                   "since": "2000-01-01T00:00:00Z"})
    assert resp.status_code == 202, resp.get_json()
    body = resp.get_json()
    assert body["total"] == 3 and body["duplicate"] is False
    again = producer.post(f"/api/v1/subscriptions/{sub_a}/replays", {"event_types": ["file.updated"],
                                                                    "since": "2000-01-01T00:00:00Z"})
    assert again.get_json()["id"] == body["id"] and again.get_json()["duplicate"] is True
    run_worker(app)
    got = producer.get(f"/api/v1/replays/{body['id']}").get_json()
    assert got["state"] == "finished" and got["done"] == 3 and got["total"] == 3
    assert got["succeeded"] + got["failed"] + got["waiting"] == 3
    entry = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "replay.started"))
    assert entry.actor_kind == "token" and producer.token.startswith(entry.actor)


@pytest.mark.parametrize("payload, status, message", [
    ({"since": "yesterday"}, 400, "since must be an RFC 3339 time"),
    ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, 422, "since must be before until"),
    ({"until": "0001-01-01T00:00:00+14:00"}, 422, "outside years 1 to 9999"),
    ({"event_types": "file.updated"}, 400, "event_types must be a list"),
    ({"event_types": ["no spaces allowed"]}, 400, "event_types must be a list of at most 100 event type names"),
    ({"state": "dead"}, 400, "unknown field(s): state"),
])
def test_the_replay_api_refuses_bad_input(producer, dead, payload, status, message):
    resp = producer.post(f"/api/v1/subscriptions/{dead['a'][0]}/replays", payload)
    assert resp.status_code == status and message in resp.get_json()["error"]
    assert db.session.scalar(select(Replay.id)) is None  # nothing stored half-way


def test_the_replay_api_keeps_teams_apart(client, producer, dead):
    assert producer.post(f"/api/v1/subscriptions/{dead['other'][0]}/replays").status_code == 404
    other = Producer(client, "other")
    started = other.post(f"/api/v1/subscriptions/{dead['other'][0]}/replays").get_json()
    assert producer.get(f"/api/v1/replays/{started['id']}").status_code == 404
    assert other.get(f"/api/v1/replays/{started['id']}").status_code == 200


def test_replay_selected_with_nothing_selected_keeps_the_filter(client, auth, dead):
    auth.login("operator")
    resp = client.post("/dead-letters/replay", data={"csrf_token": auth.csrf("/dead-letters"), "which": "selected",
                                                     "result": "404"})
    assert resp.status_code == 302 and resp.headers["Location"].endswith("/dead-letters?result=404")
    assert db.session.scalar(select(Replay.id)) is None


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def test_a_replays_audit_entry_says_what_its_page_says(app, client, auth, producer, receiver, clock, users):
    """A real replay: one subscription repaired, one still refusing. The job re-queues all four at once; the
    deliveries take hours to settle. The audit entry waits for them and then carries the page's counts, in words."""
    from dashboard.operations import sweeper
    from tests.operations.test_replays import fix_receiver
    from tests.support.pipeline import deliver_due

    mended, _ = make_dead(app, clock, producer, receiver, 400, ["file.updated"] * 3)
    make_dead(app, clock, producer, receiver, 404, ["order.paid"])
    fix_receiver(mended, receiver)
    auth.login("operator")
    started = client.post("/dead-letters/replay", data={"csrf_token": auth.csrf("/dead-letters"), "which": "matching"})
    replay_id = started.headers["Location"].rsplit("/", 1)[1]
    run_worker(app)  # the job re-queues the four; the drains deliver the three and try the fourth once
    sweeper.evaluate_minute(app, clock.now())
    entry = lambda: db.session.scalar(select(AuditEntry).where(  # noqa: E731
        AuditEntry.action == "replay.finished", AuditEntry.target == f"replay:{replay_id}"))
    assert entry() is None  # one is still on its way: the outcome is not known yet
    for _ in range(3):
        clock.advance(hours=1)
        deliver_due(app, clock)
    sweeper.evaluate_minute(app, clock.now())
    sweeper.evaluate_minute(app, clock.now())  # once only
    assert db.session.scalar(select(func.count()).select_from(AuditEntry).where(
        AuditEntry.action == "replay.finished", AuditEntry.target == f"replay:{replay_id}")) == 1

    page = client.get(f"/replays/{replay_id}").get_data(as_text=True)
    shown = {name: int(re.search(rf'class="replay-{name}[^"]*">(\d+)<', page).group(1))
             for name in ("succeeded", "failed", "waiting", "held")}
    assert shown == {"succeeded": 3, "failed": 1, "waiting": 0, "held": 0}
    audit_page = client.get("/audit?action=replay.finished").get_data(as_text=True)
    said = re.search(r'<span class="audit-summary">([^<]*)</span>', audit_page).group(1)
    assert said == "3 of 4 delivered, 1 failed (dead again), 0 still on their way, 0 held until resume"
    assert _numbers(said) == [shown["succeeded"], 4, shown["failed"], shown["waiting"], shown["held"]]
    assert entry().detail["delivered"] == 3 and entry().deliveries == 4


def test_the_audit_log_says_every_detail_in_words(app, client, auth, users, clock):
    """No Python spelling on the page, whatever an entry's detail holds: empty lists and maps, booleans."""
    from dashboard import audit

    db.session.add(AuditEntry(**audit.entry_values(
        "check.finished", at=clock.now(), team_id=users["owner"].team_id,
        detail={"failed": [], "filters": {}, "automatic": True, "event_id": None})))
    db.session.commit()
    auth.login("admin")
    html = client.get("/audit?action=check.finished").get_data(as_text=True)
    detail = re.search(r'<td class="detail[^"]*"[^>]*>(.*?)</td>', html, re.DOTALL).group(1)
    for spelling in ("[]", "{}", "True", "None"):
        assert spelling not in detail, detail
    assert "failed: none" in detail and "automatic: yes" in detail and "event id: —" in detail


def test_replaying_to_an_endpoint_that_failed_seconds_ago_warns_first(app, client, auth, producer, receiver, clock,
                                                                       users):
    from tests.operations.test_replays import fix_receiver
    from tests.support.pipeline import deliver_due

    sub_id, _ = make_dead(app, clock, producer, receiver, 400, ["file.updated"])
    auth.login("operator")
    warning = re.compile(r'class="banner replay-warning".*?</div>', re.DOTALL)
    assert not warning.search(client.get(f"/dead-letters?subscription={sub_id}").get_data(as_text=True))  # an hour ago
    producer.publish("file.updated")
    deliver_due(app, clock)  # the endpoint still answers 400
    clock.advance(seconds=40)
    for page in (f"/dead-letters?subscription={sub_id}", "/dead-letters", f"/subscriptions/{sub_id}"):
        html = client.get(page).get_data(as_text=True)
        said = warning.search(html).group(0)
        assert ("its last attempt failed 40 s ago with HTTP 400 (client error): these will likely fail again and "
                "return to the dead letters") in said, page
        assert "Careful: " in html  # in the confirmation too; the button is still there
    assert sub_id in warning.search(client.get("/dead-letters").get_data(as_text=True)).group(0)  # named
    fix_receiver(sub_id, receiver)
    clock.advance(minutes=1)
    deliver_due(app, clock)  # the retry succeeds: the endpoint answers again
    assert not warning.search(client.get(f"/dead-letters?subscription={sub_id}").get_data(as_text=True))


def test_subscriptions_that_share_a_url_are_named_apart(app, client, auth, producer, receiver, clock, users):
    """The dead letters' filter and rows, the audit log and the replay pages name a subscription by its description
    and id beside its URL: two endpoints at one URL are told apart."""
    named = {}
    for description in ("billing hook", "search hook"):
        sub_id, _ = make_dead(app, clock, producer, receiver, 400, ["file.updated"])
        db.session.get(Subscription, sub_id).description = description
        named[sub_id] = f"{description} · {sub_id} — {receiver.url}/status/400"
    db.session.commit()
    auth.login("operator")
    dead_page = client.get("/dead-letters").get_data(as_text=True)
    for sub_id, name in named.items():
        assert f'<option value="{sub_id}">{name}</option>' in dead_page
        assert f">{name}</a></td>" in dead_page  # its dead letter's row
    audit_page = client.get("/audit?action=subscription.created").get_data(as_text=True)
    assert all(f">{name}</a></td>" in audit_page for name in named.values())
    billing = next(iter(named))
    started = client.post("/dead-letters/replay", data={"csrf_token": auth.csrf("/dead-letters"), "which": "matching",
                                                        "subscription": billing})
    replay_page = client.get(started.headers["Location"]).get_data(as_text=True)
    assert f">{named[billing]}</a></dd>" in replay_page
    assert f">{named[billing]}</a><br>" in client.get("/replays").get_data(as_text=True)
