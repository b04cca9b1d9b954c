"""The dashboard's subscription pages inside the consumer portal: the subscription (deliveries, filters, check card,
diagnosis), its contract, a delivery, a replay's progress, and their buttons (pause, resume, replay one, replay all as
a job, replay since, cancel, run the check), each for the consumer's own endpoint, and nothing of the team's own tools,
users or other consumers."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re

import pytest
from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Check, Delivery, Event, Replay, Subscription

from tests.conftest import Auth, Producer, _csrf_from
from tests.support import pipeline
from tests.support.portal import open_portal

# Portal pages: no SQL of their own; the core tests run theirs on both databases.
pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

# What a portal page of cus_own must never show: users' emails, another consumer (of the team or another team),
# another team's name, the dashboard's audit log and incident rules.
NEVER_SHOWN = ("@example.com", "cus_nbr", "Globex", "cus_far", "Umbrella", "zenith-team", "Audit log",
               "incident-rules", "Signed in as", "signed in as")
LINK = re.compile(r'(?:href|action|hx-get|hx-post)="([^"]*)"')


@dataclasses.dataclass
class Party:
    """One consumer's things: its endpoint, a dead letter on it, that delivery's event, a check and a replay."""
    uid: str
    sub: str
    delivery: str
    event: str
    check: str
    replay: str
    team_id: int


def _addressed(producer, uid: str, event_type: str, resource: str) -> str:
    resp = producer.post("/api/v1/events", {"type": event_type, "data": {"resource_id": resource}, "consumer": uid})
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()["id"]


@pytest.fixture
def world(app, client, producer, receiver, users, clock):
    """cus_own (the portal's consumer, team acme), cus_nbr (acme's other consumer) and cus_far (team zenith-team's),
    each with an endpoint answering 400 and a dead letter on it (cus_own: two, of two types), a finished check and
    a finished replay asked for by a user. acme's owner has paused cus_own's endpoint; an operator disabled its
    second one."""
    app.config["PROMESA_DRAIN_LINGER_SECONDS"] = 0.0
    far = Producer(client, "zenith-team")
    producer.put_consumer("cus_own", name="Initech")
    producer.put_consumer("cus_nbr", name="Globex")
    far.put_consumer("cus_far", name="Umbrella")
    owners = {"own": (producer, "cus_own"), "nbr": (producer, "cus_nbr"), "far": (far, "cus_far")}
    subs = {name: p.subscribe(receiver.url + "/status/400", consumer=uid)["id"] for name, (p, uid) in owners.items()}
    second = producer.subscribe(receiver.url + "/status/200", consumer="cus_own", description="second")["id"]
    events = {name: _addressed(p, uid, "file.updated", f"f_{name}") for name, (p, uid) in owners.items()}
    _addressed(producer, "cus_own", "file.deleted", "f_own_deleted")
    for _ in range(3):  # a 4xx is tried three times, then dead
        pipeline.deliver_due(app, clock)
        clock.advance(hours=1)
    parties = {}
    now = clock.now()
    for name, (p, uid) in owners.items():
        delivery = db.session.scalar(select(Delivery).join(Event, Event.key == Delivery.event_key)
                                     .where(Event.id == events[name], Delivery.subscription_id == subs[name]))
        assert delivery.state == "dead"
        check = Check(id=f"chk_{name}", subscription_id=subs[name], state="finished",
                      requested_by="owner@example.com", started_at=now - dt.timedelta(minutes=5), finished_at=now,
                      results=[{"rule": "signature", "passed": False, "detail": "forged request answered 200",
                                "advice": "verify the signature"}])
        replay = Replay(actor_kind="user", actor="owner@example.com", team_id=p.team.id, subscription_id=subs[name],
                        filter={"subscription_id": subs[name], "team_id": p.team.id}, filter_key=f"sample-{name}",
                        total=0, done=0, succeeded=0, failed=0, state="finished", created_at=now, finished_at=now)
        db.session.add_all([check, replay])
        db.session.commit()
        parties[name] = Party(uid, subs[name], delivery.id, events[name], check.id, replay.id, p.team.id)
    dashboard = Auth(app.test_client())
    dashboard.login("owner")
    dashboard.client.post(f"/subscriptions/{subs['own']}/pause",
                          data={"csrf_token": dashboard.csrf(), "reason": "maintenance window"})
    dashboard.login("operator")
    dashboard.client.post(f"/subscriptions/{second}/disable",
                          data={"csrf_token": dashboard.csrf(), "reason": "answers too slowly"})
    db.session.expire_all()
    assert db.session.get(Subscription, subs["own"]).state == "paused"
    assert db.session.get(Subscription, second).state == "disabled"
    parties["second"] = second
    return parties


@pytest.fixture
def portal(app, producer, world):
    """A browser signed in to cus_own's portal."""
    browser = app.test_client()
    open_portal(browser, producer, "cus_own")
    return browser


def csrf(portal) -> str:
    return _csrf_from(portal.get("/portal/").get_data(as_text=True))


def shown(portal, path: str, status: int = 200) -> str:
    """The page at `path`, checked for what a portal page never shows and for links that leave the portal."""
    resp = portal.get(path)
    assert resp.status_code == status, (path, resp.status_code, resp.get_data(as_text=True)[:500])
    html = resp.get_data(as_text=True)
    for never in NEVER_SHOWN:
        assert never not in html, (path, never)
    leaving = [link for link in LINK.findall(html) if not link.startswith(("/portal/", "/static/", "#"))]
    assert not leaving, (path, leaving)
    return html


def test_the_subscription_page_shows_its_own_endpoint_and_none_of_the_teams_tools(portal, world):
    own = world["own"]
    html = shown(portal, f"/portal/subscriptions/{own.sub}")
    assert "/status/400" in html and "Initech" in html and own.delivery in html
    assert "Paused by acme" in html and "maintenance window" in html  # the team's name, never the owner's email
    assert f'action="/portal/subscriptions/{own.sub}/resume"' in html
    assert f'action="/portal/subscriptions/{own.sub}/replay"' in html  # replay all dead letters
    assert f'action="/portal/subscriptions/{own.sub}/replays"' in html  # replay since
    assert f'action="/portal/subscriptions/{own.sub}/checks"' in html  # run the receiver check
    assert 'id="receiver-check"' in html and "by acme" in html and "forged request answered 200" in html
    assert 'id="diagnosis"' in html and "data-cause=" in html
    assert ">← Your endpoints</a>" in html and 'href="/portal/"' in html
    for dashboard_only in ("Disable", "Discard", "Give up", "Enable"):
        assert f">{dashboard_only}" not in html, dashboard_only

    disabled = shown(portal, f"/portal/subscriptions/{world['second']}")
    assert "Disabled by acme" in disabled and "answers too slowly" in disabled and "by acme: ask them" in disabled
    assert "/resume" not in disabled and "/enable" not in disabled

    contract = shown(portal, f"/portal/subscriptions/{own.sub}/contract")
    assert "Delivery contract" in contract and 'id="snippet-python"' in contract
    assert f'href="/portal/subscriptions/{own.sub}"' in contract

    card = shown(portal, f"/portal/subscriptions/{own.sub}/checks/{own.check}")
    assert own.check in card and "by acme" in card


def test_the_delivery_page_shows_attempts_response_headers_and_the_body(portal, world):
    own = world["own"]
    html = shown(portal, f"/portal/deliveries/{own.delivery}")
    assert own.event in html and "file.updated" in html and "f_own" in html  # the event's id, type and body
    assert "status 400 from /status/400" in html  # the receiver's answer, excerpted
    assert html.count('<td data-label="#">') == 3 and "X-Signature" in html
    assert f'action="/portal/subscriptions/{own.sub}/replay"' in html and f'value="{own.delivery}"' in html
    assert ">Discard" not in html and ">Give up" not in html


def test_pause_resume_and_replay_one_delivery_in_the_portal(portal, world):
    own = world["own"]
    token = csrf(portal)
    resp = portal.post(f"/portal/subscriptions/{own.sub}/resume", data={"csrf_token": token})
    assert resp.status_code == 302 and resp.headers["Location"] == f"/portal/subscriptions/{own.sub}"
    resp = portal.post(f"/portal/subscriptions/{own.sub}/pause", data={"csrf_token": token, "reason": "deploying"})
    assert resp.status_code == 302
    db.session.expire_all()
    sub = db.session.get(Subscription, own.sub)
    assert (sub.state, sub.state_reason) == ("paused", "deploying")
    assert "Paused by you" in shown(portal, f"/portal/subscriptions/{own.sub}")
    portal.post(f"/portal/subscriptions/{own.sub}/resume", data={"csrf_token": token})

    resp = portal.post(f"/portal/subscriptions/{own.sub}/replay", data={"csrf_token": token, "delivery_id": own.delivery})
    assert resp.status_code == 302 and resp.headers["Location"] == f"/portal/deliveries/{own.delivery}"
    db.session.expire_all()
    assert db.session.get(Delivery, own.delivery).state == "pending"
    actors = db.session.execute(select(AuditEntry.action, AuditEntry.actor_kind, AuditEntry.actor)
                                .where(AuditEntry.subscription_id == own.sub, AuditEntry.actor_kind == "portal")
                                .order_by(AuditEntry.id)).all()
    assert [a for a, _, _ in actors] == ["subscription.resumed", "subscription.paused", "subscription.resumed",
                                         "deliveries.replayed"]
    assert {(kind, who) for _, kind, who in actors} == {("portal", "cus_own")}


def test_replay_all_is_a_job_with_progress_that_the_consumer_may_cancel(portal, world):
    own = world["own"]
    token = csrf(portal)
    resp = portal.post(f"/portal/subscriptions/{own.sub}/replay", data={"csrf_token": token})
    assert resp.status_code == 302 and resp.headers["Location"].startswith("/portal/replays/")
    replay = db.session.scalar(select(Replay).where(Replay.actor_kind == "portal"))
    assert resp.headers["Location"] == f"/portal/replays/{replay.id}"
    assert (replay.kind, replay.subscription_id, replay.actor, replay.total) == ("replay", own.sub, "cus_own", 2)
    page = shown(portal, f"/portal/replays/{replay.id}")
    assert "Asked by</dt><dd>you" in page and "Replaying 2 dead letters" in page and "held until" in page
    assert f'action="/portal/replays/{replay.id}/cancel"' in page
    partial = portal.get(f"/portal/replays/{replay.id}", headers={"HX-Request": "true"})
    assert partial.status_code == 200 and 'id="replay-progress"' in partial.get_data(as_text=True)
    again = portal.post(f"/portal/subscriptions/{own.sub}/replay", data={"csrf_token": token})
    assert again.headers["Location"] == f"/portal/replays/{replay.id}"  # the running one, not a second

    resp = portal.post(f"/portal/replays/{replay.id}/cancel", data={"csrf_token": token})
    assert resp.status_code == 302
    db.session.expire_all()
    assert db.session.get(Replay, replay.id).state == "cancelled"

    # A user's replay of this endpoint: the consumer sees it, asked by its team.
    assert "Asked by</dt><dd>acme" in shown(portal, f"/portal/replays/{own.replay}")

    # An endpoint with no dead letters: nothing to replay, and no job that says "0 dead letters".
    resp = portal.post(f"/portal/subscriptions/{world['second']}/replay", data={"csrf_token": token})
    assert resp.headers["Location"] == f"/portal/subscriptions/{world['second']}"
    assert "Nothing to replay" in shown(portal, resp.headers["Location"])
    assert db.session.scalar(select(func.count()).select_from(Replay).where(Replay.actor_kind == "portal")) == 1


def test_replay_since_and_the_receiver_check_from_the_portal(portal, world, clock):
    own = world["own"]
    token = csrf(portal)
    since = (clock.now() - dt.timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M")
    resp = portal.post(f"/portal/subscriptions/{own.sub}/replays", data={"csrf_token": token, "since": since})
    assert resp.status_code == 302
    replay = db.session.scalar(select(Replay).where(Replay.actor_kind == "portal"))
    assert resp.headers["Location"] == f"/portal/replays/{replay.id}" and replay.subscription_id == own.sub
    assert replay.filter["since"].startswith(since)
    assert portal.post(f"/portal/subscriptions/{own.sub}/replays",
                       data={"csrf_token": token, "since": "soon"}).status_code == 400

    resp = portal.post(f"/portal/subscriptions/{own.sub}/checks", data={"csrf_token": token})
    assert resp.status_code == 302 and resp.headers["Location"] == f"/portal/subscriptions/{own.sub}#receiver-check"
    check = db.session.scalar(select(Check).where(Check.subscription_id == own.sub, Check.state == "running"))
    assert check.requested_by == "cus_own"
    assert "by you" in shown(portal, f"/portal/subscriptions/{own.sub}/checks/{check.id}")


def test_deliveries_filter_by_event_type_and_time(portal, world, producer, clock):
    own = world["own"]
    first = clock.now() - dt.timedelta(hours=3)  # when the world's events came
    later = _addressed(producer, "cus_own", "file.updated", "f_later")
    page = f"/portal/subscriptions/{own.sub}"

    def rows(query: str) -> int:
        return shown(portal, page + query).count('<td><a href="/portal/deliveries/')

    assert rows("") == 3
    assert rows("?type=file.deleted") == 1
    after = (first + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    html = shown(portal, page + f"?from={after}")
    assert html.count('<td><a href="/portal/deliveries/') == 1 and later not in html  # the delivery, not the event
    assert f'name="from" value="{after}"' in html and f"state=dead&amp;from={after}" in html  # kept by links
    assert rows(f"?to={after}") == 2 and rows(f"?to={after}&type=file.updated") == 1
    assert rows(f"?from={first.strftime('%Y-%m-%dT%H:%M')}&to={after}&state=dead") == 2
    for bad, said in [("?from=yesterday", "from must be an ISO 8601 time"), (f"?from={after}&to={after}",
                      "from must be before to"), ("?to=99999-01-01T00:00", "to must be"),
                      ("?from=9999-12-31T23:59-05:00", "from ")]:
        resp = portal.get(page + bad)
        assert resp.status_code == 400 and said in resp.get_data(as_text=True), bad


def test_error_pages_in_the_portal_name_no_one_and_lead_back_to_its_home(portal, world):
    html = shown(portal, "/portal/subscriptions/sub_nothing", 404)
    assert "Not found" in html and 'href="/portal/">← Back' in html and "acme" in html  # the portal's own header
    html = shown(portal, "/portal/no-such-page", 404)
    assert 'href="/portal/">← Back' in html and "Endpoints" in html
    resp = portal.post(f"/portal/subscriptions/{world['own'].sub}/resume")  # no CSRF token
    html = resp.get_data(as_text=True)
    assert resp.status_code == 400 and "The form was not accepted" in html and "What each role may do" not in html
    assert 'href="/portal/">← Back' in html and "@example.com" not in html
    # A referrer outside the portal is no way back from it.
    elsewhere = portal.get("/portal/subscriptions/sub_nothing", headers={"Referer": "http://localhost/audit"})
    assert 'href="/portal/">← Back' in elsewhere.get_data(as_text=True)
