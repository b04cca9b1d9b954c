"""The overview and the dead-letter desk with many consumer endpoints: the team's own endpoints and the consumer
endpoints that need a person now are listed (paused, a disabled consumer, an open incident, dead letters, failing),
the healthy rest is one line that counts them, and they are never loaded to be judged; a consumer filter lists its
endpoints as before."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm import Session

from dashboard.core.extensions import db
from dashboard.models import Incident, Subscription, Team
from dashboard.stats import folding

from tests.conftest import Producer
from tests.support import pipeline

HEALTHY = 12


@pytest.fixture(autouse=True)
def _quick_drains(app):
    app.config["PROMESA_DRAIN_LINGER_SECONDS"] = 0.0


def acme_id() -> int:
    return db.session.scalar(select(Team.id).where(Team.name == "acme"))


def publish_to(producer, uid: str | None) -> None:
    body = {"type": "file.updated", "data": {"resource_id": "f_1"}} | ({"consumer": uid} if uid else {})
    assert producer.post("/api/v1/events", body).status_code == 202


def said(resp) -> str:
    """A page's HTML with its runs of white space as one space, as a reader sees the words."""
    return re.sub(r"\s+", " ", resp.get_data(as_text=True))


@pytest.fixture
def endpoints(app, client, producer, receiver, clock):
    """Team acme: its own endpoint, HEALTHY consumers each with a healthy endpoint, and one consumer endpoint for
    each reason to look (dead letters, paused, its consumer disabled, an open incident, failing now)."""
    own = producer.subscribe(receiver.url + "/ok/own")
    healthy = []
    for n in range(HEALTHY):
        producer.put_consumer(f"cus_ok{n}")
        healthy.append(producer.subscribe(f"{receiver.url}/ok/{n}", consumer=f"cus_ok{n}")["id"])
    unhealthy = {}
    for uid, path in [("cus_dead", "/status/400"), ("cus_paused", "/ok/p"), ("cus_off", "/ok/off"),
                      ("cus_incident", "/ok/inc"), ("cus_failing", "/status/500")]:
        producer.put_consumer(uid)
        unhealthy[uid] = producer.subscribe(receiver.url + path, consumer=uid)["id"]
    publish_to(producer, None)
    for uid in [f"cus_ok{n}" for n in range(HEALTHY)] + ["cus_dead"]:
        publish_to(producer, uid)
    for _ in range(3):  # a 4xx: three attempts, then a dead letter
        pipeline.deliver_due(app, clock)
        clock.advance(hours=1)
    publish_to(producer, "cus_failing")
    pipeline.deliver_due(app, clock)  # a 5xx: failing, scheduled again
    clock.advance(minutes=5)
    folding.fold_outcomes(clock.now())  # the sweeper's minute: the failing streak
    producer.post(f"/api/v1/subscriptions/{unhealthy['cus_paused']}/pause")
    producer.put_consumer("cus_off", state="disabled")
    now = clock.now()
    db.session.add(Incident(subscription_id=unhealthy["cus_incident"], team_id=acme_id(), rule="dead_letters",
                            state="open", opened_at=now, first_seen_at=now, last_seen_at=now, figures={"dead": 5}))
    db.session.commit()
    Producer(client, "other").put_consumer("cus_elsewhere")
    other = Producer(client, "other").subscribe(receiver.url + "/ok/other", consumer="cus_elsewhere")
    return own["id"], healthy, unhealthy, other["id"]


@pytest.fixture
def loaded_subscriptions():
    """The subscriptions each request loads from the database, as objects."""
    seen = []

    def count(session, instance):
        if isinstance(instance, Subscription):
            seen.append(instance.id)

    event.listen(Session, "loaded_as_persistent", count)
    yield seen
    event.remove(Session, "loaded_as_persistent", count)


def test_healthy_consumer_endpoints_are_one_line_and_the_unhealthy_are_listed(client, auth, users, endpoints,
                                                                            loaded_subscriptions):
    own, healthy, unhealthy, other = endpoints
    auth.login("member")
    loaded_subscriptions.clear()
    html = client.get("/").get_data(as_text=True)
    assert own in html and all(sub in html for sub in unhealthy.values()), html
    assert not any(sub in html for sub in healthy) and other not in html
    line = re.sub(r"\s+", " ", html.split('class="unlisted-consumer-endpoints')[1].split("</p>")[0])
    assert f"<strong>{HEALTHY}</strong> other consumer endpoints not listed: none is paused or disabled, in an " \
           "open incident, owed dead letters or failing." in line and f'href="/consumers?team={acme_id()}"' in line
    assert set(loaded_subscriptions) <= {own, *unhealthy.values()}  # the healthy ones are counted, never loaded

    html = client.get("/?consumer=cus_ok3").get_data(as_text=True)  # a consumer chosen: its endpoints, as before
    assert healthy[3] in html and own not in html and "unlisted-consumer-endpoints" not in html

    auth.login("operator")  # every team: acme's and the other team's healthy consumer endpoints, counted
    html = said(client.get("/"))
    assert other not in html and f"<strong>{HEALTHY + 1}</strong> other consumer endpoints" in html
    html = said(client.get(f"/?team={acme_id()}", headers={"HX-Request": "true"}))
    assert f"<strong>{HEALTHY}</strong> other consumer endpoints" in html
    assert f'href="/consumers?team={acme_id()}"' in html

    auth.login("outsider")  # the other team's owner: acme's endpoints neither listed nor counted
    html = said(client.get("/"))
    assert own not in html and not any(sub in html for sub in unhealthy.values())
    assert "<strong>1</strong> other consumer endpoint not listed" in html


def test_the_dead_letter_desk_offers_the_teams_own_endpoints_and_those_with_dead_letters(client, auth, users,
                                                                                       endpoints):
    own, healthy, unhealthy, other = endpoints
    auth.login("owner")

    def choices(url):
        html = client.get(url).get_data(as_text=True)
        return set(re.findall(r'<option value="(sub_[^"]+)"', html))

    assert choices("/dead-letters") == {own, unhealthy["cus_dead"]}
    assert choices(f"/dead-letters?subscription={healthy[0]}") == {own, unhealthy["cus_dead"], healthy[0]}
    assert choices("/dead-letters?consumer=cus_ok2") == {healthy[2]}  # a consumer's: all of its own


def test_the_oldest_due_delivery_counts_the_endpoints_not_listed(app, client, auth, producer, receiver, users, clock):
    producer.subscribe(receiver.url + "/ok/own")
    for uid in ("cus_1", "cus_2"):
        producer.put_consumer(uid)
        producer.subscribe(f"{receiver.url}/ok/{uid}", consumer=uid)
    publish_to(producer, "cus_1")  # due now; no worker takes it: waiting, not a reason to list its endpoint
    clock.advance(minutes=3)
    auth.login("member")
    html = said(client.get("/", headers={"HX-Request": "true"}))
    assert "Oldest due delivery waited</dt><dd>3 min</dd>" in html
    assert "<strong>2</strong> other consumer endpoints not listed" in html
