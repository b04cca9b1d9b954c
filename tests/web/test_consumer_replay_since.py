""""Replay since" from a consumer's page: who may (owners of its team, operators, admins; CSRF), what it refuses
on the form itself, the job's effect on a real receiver through a real RQ worker, a second click finding the running
one, and the words every page uses for it (the flash, the replay's page and progress, the replays list, the audit
log)."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import Replay, Team
from dashboard.operations import replays as replay_service

from tests.support.pipeline import deliver_due, run_worker


@pytest.fixture(autouse=True)
def _small_chunks(app):
    app.config["PROMESA_REPLAY_CHUNK"] = 2
    app.config["PROMESA_DRAIN_LINGER_SECONDS"] = 0.0


def acme_id() -> int:
    return db.session.scalar(select(Team.id).where(Team.name == "acme"))


def addressed(producer, uid: str) -> str:
    resp = producer.post("/api/v1/events", {"type": "invoice.paid", "consumer": uid, "data": {"resource_id": "i_1"}})
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()["id"]


def local(when: dt.datetime) -> str:
    """A time as a browser's datetime-local field sends it (UTC on these pages)."""
    return when.strftime("%Y-%m-%dT%H:%M")


def flashes(html: str) -> list[str]:
    return [re.sub(r"\s+", " ", f).strip() for f in re.findall(r'<p class="flash[^"]*"[^>]*>(.*?)</p>', html, re.S)]


def test_owners_operators_and_admins_may_and_the_others_may_not(client, auth, producer, receiver, users, clock):
    producer.put_consumer("cus_1")
    sub = producer.subscribe(receiver.url + "/ok", consumer="cus_1")
    page = f"/consumers/{acme_id()}/cus_1"
    form = {"subscription": sub["id"], "since": local(clock.now() - dt.timedelta(hours=1))}

    auth.login("outsider")  # another team's owner: the consumer does not exist for it
    assert client.post(page + "/replay-since", data={**form, "csrf_token": auth.csrf()}).status_code == 404
    for role in ("member", "oncall"):
        auth.login(role)
        assert "Replay since" not in client.get(page).get_data(as_text=True)
        refused = client.post(page + "/replay-since", data={**form, "csrf_token": auth.csrf()})
        assert refused.status_code == 403 and "replay this consumer&#39;s events" in refused.get_data(as_text=True)
    auth.login("owner")
    assert client.post(page + "/replay-since", data=form).status_code == 400  # no CSRF token
    assert db.session.scalar(select(Replay)) is None

    for role in ("owner", "operator", "admin"):
        auth.login(role)
        html = client.get(page).get_data(as_text=True)
        assert 'action="' + page + '/replay-since"' in html and f'<option value="{sub["id"]}"' in html
        assert client.post(page + "/replay-since", data={**form, "csrf_token": auth.csrf()}).status_code == 302
    assert len(db.session.scalars(select(Replay)).all()) == 3  # nothing owed: each ends at once, and is its own


def test_the_form_says_what_it_refuses_and_starts_nothing(client, auth, producer, receiver, users, clock):
    producer.put_consumer("cus_1")
    producer.put_consumer("cus_2")
    mine = producer.subscribe(receiver.url + "/ok/one", consumer="cus_1")
    theirs = producer.subscribe(receiver.url + "/ok/two", consumer="cus_2")
    own = producer.subscribe(receiver.url + "/ok/own")
    auth.login("owner")
    page = f"/consumers/{acme_id()}/cus_1"
    hour_ago = local(clock.now() - dt.timedelta(hours=1))

    for form, words in [
        ({"subscription": theirs["id"], "since": hour_ago}, "Choose one of the endpoints of cus_1."),
        ({"subscription": own["id"], "since": hour_ago}, "Choose one of the endpoints of cus_1."),
        ({"subscription": mine["id"], "since": ""}, "Say since when"),
        ({"subscription": mine["id"], "since": "yesterday"}, "since must be an ISO 8601 time"),
        ({"subscription": mine["id"], "since": local(clock.now() + dt.timedelta(days=1))}, "Since is in the future"),
    ]:
        resp = client.post(page + "/replay-since", data={**form, "csrf_token": auth.csrf()})
        html = resp.get_data(as_text=True)
        assert resp.status_code == 422, form
        form_html = html.split('id="replay-since"')[1].split("</section>")[0]
        assert words in form_html and 'role="alert"' in form_html, form
        assert f'value="{form["since"]}"' in form_html  # the form as it was sent
    assert db.session.scalar(select(Replay)) is None
    options = re.findall(r'<option value="([^"]+)"', html.split('id="replay-since"')[1])
    assert options == [mine["id"]]  # only the consumer's own endpoints to choose from


def test_it_sends_the_consumers_events_to_the_endpoint_and_says_so_everywhere(app, client, auth, producer, receiver,
                                                                             users, clock):
    producer.put_consumer("cus_1")
    before = addressed(producer, "cus_1")
    clock.advance(minutes=10)
    since = clock.now()
    late = [addressed(producer, "cus_1") for _ in range(3)]  # no endpoint yet: kept, delivered to nobody
    clock.advance(minutes=10)
    sub = producer.subscribe(receiver.url + "/ok/cus_1", event_types=["invoice.*"], consumer="cus_1")
    page = f"/consumers/{acme_id()}/cus_1"
    form = {"subscription": sub["id"], "since": since.strftime("%Y-%m-%dT%H:%M:%S")}

    auth.login("owner")
    resp = client.post(page + "/replay-since", data={**form, "csrf_token": auth.csrf()}, follow_redirects=True)
    html = resp.get_data(as_text=True)
    replay = db.session.scalar(select(Replay))
    assert (replay.kind, replay.total, replay.state) == ("recover", 3, "queued")
    assert flashes(html) == [f"Sending the events addressed to cus_1 since {since:%Y-%m-%d %H:%M:%S} UTC that this "
                             "endpoint never received or that died: 3 to send."]
    assert "<strong class=\"replay-done\">0</strong> of <strong class=\"replay-total\">3</strong> events queued " \
           "for the endpoint" in html and "dead letters" not in html
    assert f'hx-get="/replays/{replay.id}"' in html  # it polls its progress
    assert f'events addressed to consumer <a href="{page}"><code>cus_1</code></a> since ' \
           f"{since:%Y-%m-%d %H:%M:%S} UTC" in html
    assert "consumer_id=" not in html and "team_id=" not in html and f'href="/subscriptions/{sub["id"]}"' in html

    again = client.post(page + "/replay-since", data={**form, "csrf_token": auth.csrf()}, follow_redirects=True)
    assert flashes(again.get_data(as_text=True)) == ["This replay since is already running: here it is."]
    assert len(db.session.scalars(select(Replay)).all()) == 1

    run_worker(app)  # the job, in chunks of 2, then the drain jobs it started
    deliver_due(app, clock)
    ids = [json.loads(r.body)["id"] for r in receiver.requests if r.path == "/ok/cus_1"]
    assert sorted(ids) == sorted(late) and before not in ids
    html = client.get(f"/replays/{replay.id}").get_data(as_text=True)
    assert "<strong class=\"replay-done\">3</strong> of <strong class=\"replay-total\">3</strong> events queued " \
           "for the endpoint" in html and '<span class="replay-succeeded">3</span> delivered' in html
    html = client.get("/replays").get_data(as_text=True)
    assert "events addressed to consumer" in html and "consumer_id=" not in html
    assert '<td data-label="Kind">replay since</td>' in html

    with app.app_context():
        assert replay_service.record_outcomes(clock.now()) == 1  # the sweeper's step: recover.finished
    html = client.get("/audit?team=acme&consumer=cus_1").get_data(as_text=True)
    assert f"Replay since {since:%Y-%m-%d %H:%M:%S} UTC for consumer cus_1: 3 events its endpoint never " \
           "received or that died, to send" in html
    assert "3 events queued for the endpoint: 3 delivered, 0 failed (dead), 0 still on their way, " \
           "0 held until resume" in html
    assert "consumer_id" not in html


def test_a_disabled_consumers_replay_since_says_it_is_held(app, client, auth, producer, receiver, users, clock):
    producer.put_consumer("cus_1")
    since = clock.now()
    addressed(producer, "cus_1")
    sub = producer.subscribe(receiver.url + "/ok", consumer="cus_1")
    page = f"/consumers/{acme_id()}/cus_1"
    auth.login("operator")
    client.post(page + "/disable", data={"csrf_token": auth.csrf(), "reason": "moving"})
    html = client.post(page + "/replay-since", data={"csrf_token": auth.csrf(), "subscription": sub["id"],
                                                     "since": since.strftime("%Y-%m-%dT%H:%M:%S")},
                       follow_redirects=True).get_data(as_text=True)
    assert flashes(html)[-1].endswith(
        "1 to send. Consumer cus_1 is disabled: they are held until it is enabled, nothing is sent before.")


def test_a_cancelled_replay_since_counts_events_not_dead_letters(app, client, auth, producer, receiver, users, clock):
    producer.put_consumer("cus_1")
    since = clock.now()
    for _ in range(3):
        addressed(producer, "cus_1")
    sub = producer.subscribe(receiver.url + "/ok", consumer="cus_1")
    auth.login("owner")
    client.post(f"/consumers/{acme_id()}/cus_1/replay-since", data={
        "csrf_token": auth.csrf(), "subscription": sub["id"], "since": since.strftime("%Y-%m-%dT%H:%M:%S")})
    replay = db.session.scalar(select(Replay))
    html = client.post(f"/replays/{replay.id}/cancel", data={"csrf_token": auth.csrf()},
                       follow_redirects=True).get_data(as_text=True)
    assert flashes(html) == ["Cancelled after 0 of 3 events."]
    html = client.get("/audit?team=acme&consumer=cus_1").get_data(as_text=True)
    assert "0 of 3 events queued for the endpoint" in html and "dead letters re-queued" not in html


def test_the_form_previews_what_it_would_send_now(client, auth, producer, receiver, users, clock):
    producer.put_consumer("cus_1")
    since = clock.now()
    for _ in range(3):
        addressed(producer, "cus_1")
    sub = producer.subscribe(receiver.url + "/ok", event_types=["invoice.*"], consumer="cus_1")
    preview = f"/consumers/{acme_id()}/cus_1/replay-since"
    asked = {"subscription": sub["id"], "since": since.strftime("%Y-%m-%dT%H:%M:%S")}
    for role in ("member", "oncall"):
        auth.login(role)
        assert client.get(preview, query_string=asked).status_code == 403
    auth.login("operator")
    html = re.sub(r"\s+", " ", client.get(preview, query_string=asked).get_data(as_text=True))
    assert f'Now: <strong class="recover-owed">3</strong> events since {since:%Y-%m-%d %H:%M:%S} UTC that this ' \
           "endpoint never received or that died." in html
    html = client.get(preview, query_string={"subscription": sub["id"]}).get_data(as_text=True)
    assert "Say since when" in html and "recover-owed" not in html
    assert db.session.scalar(select(Replay)) is None  # a preview starts nothing
