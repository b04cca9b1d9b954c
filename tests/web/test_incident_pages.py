"""The on-call page and the incidents list: what fired, the evidence (escaped), and the buttons."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from sqlalchemy import func, select, update

from dashboard.core.extensions import db
from dashboard.models import Attempt, AuditEntry, Delivery, Incident, IncidentRule, Subscription
from dashboard.operations import notifications
from dashboard.operations.sweeper import sweep_once
from dashboard.stats.outcomes import minute_of

from tests.support.pipeline import deliver_due

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
SHOWN = "%Y-%m-%d %H:%M:%S"  # the dashboard's one way to write a time (the `utc` filter)


@pytest.fixture
def fired(app, producer, receiver, clock, users):
    """A 4xx receiver, five dead letters, one open dead_letters incident."""
    sub = producer.subscribe(receiver.url + "/status/400", description="billing")
    for _ in range(5):
        producer.publish()
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(minutes=2)
    sweep_once(app)
    incident = db.session.scalar(select(Incident))
    assert incident is not None
    return sub, incident


def test_oncall_sees_what_fired_and_the_evidence_escaped(client, auth, fired):
    sub, incident = fired
    db.session.execute(update(Attempt).where(Attempt.id == db.session.scalar(select(Attempt.id).limit(1)))
                       .values(response_excerpt="<script>alert(1)</script>"))
    db.session.commit()
    auth.login("oncall")
    page = client.get(f"/incidents/{incident.id}").get_data(as_text=True)
    assert "Dead letters piling up" in page and sub["url"] in page
    assert "at least 5 dead letters in 15 min" in page
    assert "5 dead-lettered in the 15-minute window, 5 still dead" in page  # what each figure counts
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    assert "status 400 from /status/400" in page  # the receiver's answer, as the last distinct failure
    assert page.count('class="dead"') >= 1 and "<svg" in page and "style=" not in page
    assert f'/audit?subscription={sub["id"]}' in page and f'/subscriptions/{sub["id"]}/contract' in page
    assert "Acknowledge" in page and "Replay these" not in page  # oncall acknowledges, does not replay
    assert 'name="delivery_id"' not in page


def test_the_list_puts_open_incidents_first_and_the_nav_shows_a_badge(client, auth, fired, clock):
    _, incident = fired
    now = clock.now()
    db.session.add(Incident(subscription_id=None, rule="backlog", state="resolved", opened_at=now, first_seen_at=now,
                            last_seen_at=now, resolved_at=now, figures={}))
    db.session.commit()
    auth.login("member")  # acme's member sees acme's incident, not Promesa's own
    page = client.get("/incidents").get_data(as_text=True)
    assert incident.id in page and "Promesa itself" not in page
    assert "1 open incident" in client.get("/").get_data(as_text=True)
    client.post("/logout", data={"csrf_token": auth.csrf()})
    auth.login("admin")
    page = client.get("/incidents").get_data(as_text=True)
    assert page.index(incident.id) < page.index("Promesa itself")


def test_an_operator_replays_the_windows_dead_letters_from_the_incident(client, auth, fired, app, clock, receiver):
    sub, incident = fired
    auth.login("operator")
    page = client.get(f"/incidents/{incident.id}").get_data(as_text=True)
    assert "Replay these (5, or the ticked ones)" in page
    dead = db.session.scalars(select(Delivery.id).where(Delivery.state == "dead")).all()
    resp = client.post(f"/incidents/{incident.id}/replay",
                       data={"csrf_token": auth.csrf(), "delivery_id": [dead[0], "dlv_not_in_this_window"]},
                       follow_redirects=True)
    assert "Replaying 1 dead letters" in resp.get_data(as_text=True)
    resp = client.post(f"/incidents/{incident.id}/replay", data={"csrf_token": auth.csrf()}, follow_redirects=True)
    assert "Replaying 4 dead letters" in resp.get_data(as_text=True)
    before = receiver.count()
    deliver_due(app, clock)
    assert receiver.count() == before + 5
    page = client.get(f"/incidents/{incident.id}").get_data(as_text=True)
    assert "status 400 from /status/400" in page  # the evidence stays after the replay


def test_an_operator_pauses_from_the_incident(client, auth, fired):
    sub, incident = fired
    auth.login("operator")
    client.post(f"/incidents/{incident.id}/pause", data={"csrf_token": auth.csrf()})
    page = client.get(f"/incidents/{incident.id}").get_data(as_text=True)
    assert "paused by operator@example.com from incident" in page


def test_owners_tune_a_rule_and_bad_input_changes_nothing(client, auth, fired, app, clock, producer):
    sub, incident = fired
    auth.login("owner")
    page = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    assert "Incident rules" in page and "at least 50 % of attempts failed over 15 min" in page
    resp = client.post(f"/subscriptions/{sub['id']}/rules/dead_letters",
                       data={"csrf_token": auth.csrf(), "enabled": "on", "threshold": "0"})
    assert resp.status_code == 400 and b"threshold must be from 1" in resp.data
    assert db.session.scalar(select(IncidentRule)) is None
    resp = client.post(f"/subscriptions/{sub['id']}/rules/dead_letters",
                       data={"csrf_token": auth.csrf(), "enabled": "on", "threshold": "10", "window_minutes": "30",
                             "back": f"/incidents/{incident.id}"})
    assert resp.status_code == 302 and resp.headers["Location"] == f"/incidents/{incident.id}"
    assert "Saved: dead_letters opens an incident when at least 10 dead letters in 30 min." in \
        client.get(resp.headers["Location"]).get_data(as_text=True)
    clock.advance(minutes=1)
    sweep_once(app)  # 5 dead letters no longer reach the subscription's own threshold of 10
    clock.advance(minutes=31)
    sweep_once(app)
    db.session.expire_all()
    assert db.session.get(Incident, incident.id).state == "resolved"
    client.post(f"/subscriptions/{sub['id']}/rules/failure_rate", data={"csrf_token": auth.csrf()})
    page = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    assert "Saved: failure_rate is off: it opens no incident." in page
    assert "at least 10 dead letters in 30 min" in page
    assert db.session.get(IncidentRule, (sub["id"], "failure_rate")).enabled is False


def test_the_member_can_acknowledge_but_not_edit_rules(client, auth, fired):
    sub, incident = fired
    auth.login("member")
    page = client.get(f"/incidents/{incident.id}").get_data(as_text=True)
    assert "Acknowledge" in page and "rules/dead_letters" not in page
    client.post(f"/incidents/{incident.id}/acknowledge", data={"csrf_token": auth.csrf()})
    page = client.get(f"/incidents/{incident.id}").get_data(as_text=True)
    assert "by member@example.com" in page and ">Acknowledge<" not in page


def test_promesas_own_incident_is_for_global_readers(client, auth, users, clock):
    now = clock.now()
    incident = Incident(subscription_id=None, rule="backlog", state="open", opened_at=now, first_seen_at=now,
                        last_seen_at=now, figures={"due": 3, "oldest_waited_minutes": 12.5, "window_minutes": 10})
    db.session.add(incident)
    db.session.commit()
    auth.login("owner")
    assert client.get(f"/incidents/{incident.id}").status_code == 404
    assert client.post(f"/incidents/{incident.id}/acknowledge", data={"csrf_token": auth.csrf()}).status_code == 404
    client.post("/logout", data={"csrf_token": auth.csrf()})
    auth.login("oncall")
    page = client.get(f"/incidents/{incident.id}").get_data(as_text=True)
    assert "Delivery backlog" in page and "Promesa's own health" in page and "3 deliveries due; the oldest has waited 12.5 min" in page
    # Nothing to pause: it is about no subscription.
    assert client.post(f"/incidents/{incident.id}/pause", data={"csrf_token": auth.csrf()}).status_code == 404


# -- issue 36: every sentence, count and time on the incident pages is true where it is shown
def _flash(resp) -> str:
    return re.search(r'class="flash[^"]*"[^>]*>(.*?)</', resp.get_data(as_text=True), re.S).group(1).strip()


def _chart_times(page: str) -> list[str]:
    return re.findall(r"<title>([^<]*?) UTC:", page)


def test_acknowledging_says_how_many_sinks_will_be_told(client, auth, fired, receiver):
    _, incident = fired
    auth.login("oncall")
    told = _flash(client.post(f"/incidents/{incident.id}/acknowledge", data={"csrf_token": auth.csrf()},
                              follow_redirects=True))
    assert "have been told" not in told
    assert "No notification sink is configured, so none will be told" in told and "an admin" in told
    notifications.add_sink("json", receiver.url + "/ok")
    notifications.add_sink("slack", receiver.url + "/ok")
    told = _flash(client.post(f"/incidents/{incident.id}/resolve", data={"csrf_token": auth.csrf()},
                              follow_redirects=True))
    assert told.startswith("Resolved: 2 notification sinks will be told.")


def test_the_chart_ends_now_or_when_it_resolved(client, auth, fired, clock):
    _, incident = fired
    auth.login("oncall")
    times = _chart_times(client.get(f"/incidents/{incident.id}").get_data(as_text=True))
    assert times[-1] == minute_of(clock.now()).strftime(SHOWN)
    client.post(f"/incidents/{incident.id}/resolve", data={"csrf_token": auth.csrf()})
    resolved_at = clock.now()
    clock.advance(minutes=30)
    times = _chart_times(client.get(f"/incidents/{incident.id}").get_data(as_text=True))
    assert times[-1] == minute_of(resolved_at).strftime(SHOWN)


def test_the_chart_says_its_scale_and_its_real_counts(client, auth, fired):
    _, incident = fired
    auth.login("oncall")
    page = " ".join(client.get(f"/incidents/{incident.id}").get_data(as_text=True).split())
    attempts = db.session.scalar(select(func.count()).select_from(Attempt))
    assert not re.search(r">\d+ attempts<", page)  # the scale's top is not a count
    assert re.search(r"the bars' scale runs from 0 to \d+ attempts per 1 min\.", page)
    assert f"In this chart: 0 succeeded, {attempts} failed, 5 dead-lettered;" in page


def test_the_windows_dead_letters_count_those_since_replayed(client, auth, fired):
    _, incident = fired
    auth.login("operator")
    client.post(f"/incidents/{incident.id}/replay", data={"csrf_token": auth.csrf()})
    page = " ".join(client.get(f"/incidents/{incident.id}").get_data(as_text=True).split())
    assert "Dead letters in the window (0)" not in page
    assert "5 dead-lettered in the window: 5 replayed since, 0 still dead." in page


def test_still_dead_counts_the_same_window_as_the_figure_beside_it(app, client, auth, fired, producer, clock):
    _, incident = fired  # five dead letters four minutes into the outage
    clock.advance(minutes=4)
    for _ in range(5):
        producer.publish()
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(minutes=2)
    clock.advance(minutes=4)
    sweep_once(app)  # the 15-minute window now holds the second five only; ten are still dead
    auth.login("oncall")
    page = " ".join(client.get(f"/incidents/{incident.id}").get_data(as_text=True).split())
    assert "5 dead-lettered in the 15-minute window, 5 still dead" in page
    assert "10 dead-lettered in the window: 0 replayed since, 10 still dead." in page


def test_every_time_on_the_pages_is_written_one_way(client, auth, fired, clock):
    _, incident = fired
    auth.login("oncall")
    client.post(f"/incidents/{incident.id}/acknowledge", data={"csrf_token": auth.csrf()})
    client.post(f"/incidents/{incident.id}/snooze", data={"csrf_token": auth.csrf(), "hours": "4"})
    for path in (f"/incidents/{incident.id}", "/incidents"):
        text = re.sub(r"<[^>]+>", " ", client.get(path).get_data(as_text=True))
        dated = re.findall(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d)?(?:\.\d+)?Z?", text)
        assert dated and all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", t) for t in dated), dated
        assert not re.search(r"(?<![-\d ])(?<!\d\d \d\d)\b\d\d:\d\d\b(?!:\d\d)", re.sub(
            r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "", text)), "a time without its date"


def test_the_first_sign_is_never_before_the_subscription_existed(app, producer, receiver, clock, users):
    sub = producer.subscribe(receiver.url + "/status/503")
    created_at = db.session.get(Subscription, sub["id"]).created_at
    assert created_at != minute_of(created_at)  # the subscription began within a minute, as nearly all do
    clock.set(max(clock.now(), created_at))
    for _ in range(20):
        producer.publish()
    deliver_due(app, clock, rounds=1)  # twenty failures in the subscription's first minute: failure_rate fires
    clock.advance(seconds=1)
    sweep_once(app)
    incident = db.session.scalar(select(Incident))
    assert incident.rule == "failure_rate"
    assert incident.first_seen_at >= created_at


def test_a_snooze_can_be_ended_and_is_never_shortened_silently(client, auth, fired, clock):
    _, incident = fired
    auth.login("oncall")
    client.post(f"/incidents/{incident.id}/snooze", data={"csrf_token": auth.csrf(), "hours": "12"})
    long_until = clock.now() + dt.timedelta(hours=12)
    clock.advance(minutes=5)
    page = client.get(f"/incidents/{incident.id}").get_data(as_text=True)
    short_until = clock.now() + dt.timedelta(hours=1)
    assert f"1 hour: shortens it to {short_until:{SHOWN}}" in page
    told = _flash(client.post(f"/incidents/{incident.id}/snooze", data={"csrf_token": auth.csrf(), "hours": "1"},
                              follow_redirects=True))
    assert told.startswith(f"Snooze shortened: until {short_until:{SHOWN}} UTC (it was until {long_until:{SHOWN}} UTC)")
    db.session.refresh(incident)
    assert incident.snoozed_until == short_until

    assert client.post(f"/incidents/{incident.id}/unsnooze").status_code == 400  # no CSRF token
    assert client.get(f"/incidents/{incident.id}/unsnooze").status_code == 405
    client.post("/logout", data={"csrf_token": auth.csrf()})
    auth.login("outsider")
    assert client.post(f"/incidents/{incident.id}/unsnooze", data={"csrf_token": auth.csrf()}).status_code == 404
    client.post("/logout", data={"csrf_token": auth.csrf()})
    auth.login("oncall")
    told = _flash(client.post(f"/incidents/{incident.id}/unsnooze", data={"csrf_token": auth.csrf()},
                              follow_redirects=True))
    assert told.startswith("Snooze ended: notifications about it resume now.")
    db.session.refresh(incident)
    assert incident.snoozed_until is None
    [entry] = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "incident.unsnoozed"))
    assert entry.actor == "oncall@example.com"
    page = client.get(f"/incidents/{incident.id}").get_data(as_text=True)
    assert "snoozed until" not in page and "End snooze" not in page
    told = _flash(client.post(f"/incidents/{incident.id}/unsnooze", data={"csrf_token": auth.csrf()},
                              follow_redirects=True))
    assert told == "It is not snoozed: nothing to end."


def test_replaying_from_the_incident_warns_that_the_endpoint_still_fails(client, auth, fired):
    _, incident = fired
    auth.login("operator")
    page = " ".join(client.get(f"/incidents/{incident.id}").get_data(as_text=True).split())
    warning = ("Before you replay: its last attempt failed 2 min ago with HTTP 400 (client error), and an incident "
               "about it is open: these will likely fail again and return to the dead letters.")
    assert warning in page
    assert 'data-confirm="Replay these dead letters? Careful: its last attempt failed 2 min ago' in page
    auth.login("oncall")  # who may not replay is not warned about replaying
    assert "Before you replay" not in client.get(f"/incidents/{incident.id}").get_data(as_text=True)
