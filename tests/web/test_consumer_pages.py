"""The consumers pages (the list, one consumer's page, disable and enable), the consumer named on the subscription,
delivery and event pages, and the consumer filter of the overview, the dead-letter desk, the events page and the
audit log."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Consumer, Delivery, Replay, Subscription, Team

from tests.conftest import Producer
from tests.support import pipeline

HOSTILE = "<script>alert('name')</script>"


def acme_id() -> int:
    return db.session.scalar(select(Team.id).where(Team.name == "acme"))


def publish_to(producer, uid: str | None, event_type="file.updated") -> dict:
    body = {"type": event_type, "data": {"resource_id": "f_1"}} | ({"consumer": uid} if uid else {})
    resp = producer.post("/api/v1/events", body)
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()


def make_dead(app, clock, producer, receiver, uid: str | None, events: int) -> tuple[str, set[str]]:
    """An endpoint of consumer `uid` (None: the team's own) answering 400, and `events` dead letters on it, killed
    by the real pipeline (a 4xx: three attempts). Returns (subscription id, dead delivery ids)."""
    sub = producer.subscribe(receiver.url + "/status/400", **({"consumer": uid} if uid else {}))
    for _ in range(events):
        publish_to(producer, uid)
    for _ in range(3):
        pipeline.deliver_due(app, clock)
        clock.advance(hours=1)
    dead = set(db.session.scalars(select(Delivery.id).where(Delivery.subscription_id == sub["id"],
                                                            Delivery.state == "dead")))
    assert len(dead) == events
    return sub["id"], dead


@pytest.fixture(autouse=True)
def _quick_drains(app):
    app.config["PROMESA_DRAIN_LINGER_SECONDS"] = 0.0


def test_the_list_finds_by_uid_prefix_or_name_and_pages_by_uid(client, auth, producer, users, monkeypatch):
    from dashboard.web.pages import consumers

    for uid, name in [("cus_a1", "Alpha Corp"), ("cus_a2", "Beta Zone Ltd"), ("cus_b1", "Alphabet Inc"), ("zed", "")]:
        producer.put_consumer(uid, name=name)
    Producer(client, "other").put_consumer("cus_a9", name="Alpha of another team")
    auth.login("member")

    def uids(url):
        html = client.get(url).get_data(as_text=True)
        return re.findall(r'href="/consumers/\d+/([^"]+)"', html), html

    assert uids("/consumers?q=cus_a")[0] == ["cus_a1", "cus_a2"]  # by uid prefix, never another team's
    assert uids("/consumers?q=alpha")[0] == ["cus_a1", "cus_b1"]  # by words of the name, any case
    assert uids("/consumers?q=z")[0] == ["zed"]  # a uid starts with it: the names with a z are not searched
    found, html = uids("/consumers?q=nobody")
    assert found == [] and "No consumer of acme has a uid starting with “nobody”, nor a name containing it." in html

    monkeypatch.setattr(consumers, "PAGE", 2)
    seen, url = [], "/consumers"
    while url:
        found, html = uids(url)
        seen += found
        nxt = re.search(r'href="(/consumers\?[^"]*after=[^"]+)">Next', html)
        url = nxt.group(1).replace("&amp;", "&") if nxt else None
    assert seen == ["cus_a1", "cus_a2", "cus_b1", "zed"]
    found, html = uids("/consumers?q=cus")  # a search pages too, and keeps its words
    nxt = re.search(r'href="(/consumers\?[^"]*after=[^"]+)">Next', html).group(1).replace("&amp;", "&")
    assert found == ["cus_a1", "cus_a2"] and "q=cus" in nxt and uids(nxt)[0] == ["cus_b1"]


def test_those_who_see_every_team_pick_one(client, auth, producer, users):
    producer.put_consumer("cus_1")
    Producer(client, "other").put_consumer("cus_2")
    auth.login("oncall")
    assert "Choose a team to see its consumers." in client.get("/consumers").get_data(as_text=True)
    html = client.get(f"/consumers?team={acme_id()}").get_data(as_text=True)
    assert "cus_1" in html and "cus_2" not in html


def test_a_consumer_page_shows_its_endpoints_health_and_dead_letters(app, client, auth, producer, receiver, users,
                                                                     clock):
    producer.put_consumer("cus_1", name="Initech")
    producer.put_consumer("cus_2")
    sub, dead = make_dead(app, clock, producer, receiver, "cus_1", 2)
    _, others = make_dead(app, clock, producer, receiver, "cus_2", 1)
    healthy = producer.subscribe(receiver.url + "/ok", consumer="cus_1")
    auth.login("member")

    html = client.get(f"/consumers?team={acme_id()}").get_data(as_text=True)
    row = html.split('href="/consumers/')[1].split("</tr>")[0]
    assert row.startswith(f'{acme_id()}/cus_1"') and "Initech" in row
    assert '<td data-label="Endpoints">2</td>' in row and "1 of 2 failing or stopped" in row
    assert re.search(r'data-label="Dead letters"><a class="bad" href="[^"]+consumer=cus_1[^"]*">2</a>', row)

    html = client.get(f"/consumers/{acme_id()}/cus_1").get_data(as_text=True)
    assert f'href="/subscriptions/{sub}"' in html and f'href="/subscriptions/{healthy["id"]}"' in html
    assert all(d in html for d in dead) and not any(d in html for d in others)
    assert "<strong>2</strong> dead letters" in html
    assert "<button" not in html.split("<h2>Endpoints</h2>")[0].split("</header>")[1]  # a member gets no buttons
    assert client.get(f"/consumers/{acme_id()}/cus_nobody").status_code == 404


def test_an_owner_disables_and_enables_its_consumer_and_the_others_may_not(app, client, auth, producer, receiver,
                                                                            users):
    producer.put_consumer("cus_1")
    producer.subscribe(receiver.url + "/ok", consumer="cus_1")
    publish_to(producer, "cus_1")
    page = f"/consumers/{acme_id()}/cus_1"

    auth.login("outsider")  # the owner of another team: acme's consumer does not exist for it
    assert client.get(page).status_code == 404
    assert client.get(f"/consumers?team={acme_id()}").status_code == 404
    assert client.post(page + "/disable", data={"csrf_token": auth.csrf(), "reason": "x"}).status_code == 404

    for role in ("member", "oncall"):
        auth.login(role)
        assert client.post(page + "/disable", data={"csrf_token": auth.csrf(), "reason": "x"}).status_code == 403

    auth.login("owner")
    assert client.post(page + "/disable", data={"reason": "no token"}).status_code == 400  # no CSRF token
    refused = client.post(page + "/disable", data={"csrf_token": auth.csrf(), "reason": " "})
    assert refused.status_code == 400 and "Say why you disable this consumer" in refused.get_data(as_text=True)
    db.session.expire_all()
    assert db.session.scalar(select(Consumer.state)) == "active"
    assert db.session.scalar(select(Delivery.state)) == "pending"

    done = client.post(page + "/disable", data={"csrf_token": auth.csrf(), "reason": "moving <datacentre>"},
                       follow_redirects=True)
    html = done.get_data(as_text=True)
    assert "Disabled: 1 waiting delivery is held, and new ones too, until someone enables it." in html
    assert "moving &lt;datacentre&gt;" in html
    db.session.expire_all()
    assert db.session.scalar(select(Delivery.state)) == "held"

    auth.login("operator")  # operators repair any team's
    html = client.post(page + "/enable", data={"csrf_token": auth.csrf()}, follow_redirects=True).get_data(as_text=True)
    assert "Enabled: 1 held delivery is on its way." in html
    db.session.expire_all()
    assert db.session.scalar(select(Delivery.state)) == "pending"
    entries = db.session.execute(select(AuditEntry.action, AuditEntry.actor).where(AuditEntry.target == "consumer:cus_1")
                                 .order_by(AuditEntry.id)).all()
    assert entries[-2:] == [("consumer.disabled", "owner@example.com"), ("consumer.enabled", "operator@example.com")]


def test_a_hostile_name_is_shown_as_text_everywhere(app, client, auth, producer, receiver, users, clock):
    producer.put_consumer("cus_1", name=HOSTILE)
    sub = producer.subscribe(receiver.url + "/ok", consumer="cus_1")
    event = publish_to(producer, "cus_1")
    delivery = db.session.scalar(select(Delivery.id))
    auth.login("owner")
    for url in ("/consumers", f"/consumers/{acme_id()}/cus_1", f"/subscriptions/{sub['id']}",
                f"/deliveries/{delivery}", f"/events/{event['id']}"):
        html = client.get(url).get_data(as_text=True)
        assert "&lt;script&gt;alert(" in html and "<script>alert(" not in html, url
        assert f'href="/consumers/{acme_id()}/cus_1"' in html, url  # the uid links to the consumer's page


def test_the_new_subscription_form_takes_a_consumer_and_names_an_unknown_one(client, auth, producer, users):
    producer.put_consumer("cus_1")
    auth.login("owner")
    form = {"csrf_token": auth.csrf(), "url": "https://example.com/hooks", "signature_scheme": "promesa",
            "event_types": "*", "retry_policy": "exponential", "connect_timeout": "5", "attempt_timeout": "10",
            "max_age_seconds": "86400"}
    refused = client.post("/subscriptions/new", data={**form, "consumer": "cus_nobody"})
    assert refused.status_code == 422
    html = refused.get_data(as_text=True)
    assert "your team has no consumer &#39;cus_nobody&#39;" in html and 'value="cus_nobody"' in html
    assert client.post("/subscriptions/new", data={**form, "consumer": "cus_1"}).status_code == 303
    consumer = db.session.scalar(select(Consumer).where(Consumer.uid == "cus_1"))
    assert db.session.scalar(select(Subscription.consumer_id)) == consumer.id
    assert 'value="cus_1"' in client.get("/subscriptions/new?consumer=cus_1").get_data(as_text=True)


def test_the_consumer_filter_on_the_overview_the_events_and_the_audit_log(app, client, auth, producer, receiver,
                                                                          users):
    producer.put_consumer("cus_1")
    producer.put_consumer("cus_2")
    mine = producer.subscribe(receiver.url + "/ok/one", consumer="cus_1")
    theirs = producer.subscribe(receiver.url + "/ok/two", consumer="cus_2")
    own = producer.subscribe(receiver.url + "/ok/own")
    addressed, elsewhere, unaddressed = publish_to(producer, "cus_1"), publish_to(producer, "cus_2"), publish_to(producer, None)
    producer.post(f"/api/v1/subscriptions/{mine['id']}/pause")
    producer.post(f"/api/v1/subscriptions/{theirs['id']}/pause")
    team = acme_id()

    auth.login("member")  # the member's own team: no team to pick
    html = client.get("/?consumer=cus_1").get_data(as_text=True)
    assert mine["id"] in html and theirs["id"] not in html and own["id"] not in html
    html = client.get("/events?consumer=cus_1").get_data(as_text=True)
    assert addressed["id"] in html and elsewhere["id"] not in html and unaddressed["id"] not in html
    html = client.get("/audit?consumer=cus_1").get_data(as_text=True)
    assert "consumer:cus_1" in html and "consumer:cus_2" not in html
    assert mine["id"] in html and theirs["id"] not in html  # its subscriptions' entries too
    assert client.get("/events?consumer=bad%20uid").status_code == 400

    auth.login("operator")  # sees every team: the uid needs its team
    assert client.get("/?consumer=cus_1").status_code == 400
    html = client.get(f"/?team={team}&consumer=cus_1").get_data(as_text=True)
    assert mine["id"] in html and theirs["id"] not in html
    assert f'hx-get="/?team={team}&amp;consumer=cus_1"' in html  # the poll keeps the filter
    html = client.get(f"/events?team={team}&consumer=cus_2").get_data(as_text=True)
    assert elsewhere["id"] in html and addressed["id"] not in html
    html = client.get("/audit?team=acme&consumer=cus_2").get_data(as_text=True)
    assert "consumer:cus_2" in html and "consumer:cus_1" not in html


def test_the_dead_letter_desk_replays_one_consumers_dead_letters(app, client, auth, producer, receiver, users, clock):
    producer.put_consumer("cus_1")
    producer.put_consumer("cus_2")
    sub_1, dead_1 = make_dead(app, clock, producer, receiver, "cus_1", 2)
    sub_2, dead_2 = make_dead(app, clock, producer, receiver, "cus_2", 1)
    _, dead_own = make_dead(app, clock, producer, receiver, None, 1)
    other = Producer(client, "other")
    other.put_consumer("cus_1")  # the same uid in another team is another consumer
    _, dead_other = make_dead(app, clock, other, receiver, "cus_1", 1)
    team = acme_id()

    auth.login("operator")
    assert client.get("/dead-letters?consumer=cus_1").status_code == 400  # which team's cus_1?
    html = client.get(f"/dead-letters?team={team}&consumer=cus_1").get_data(as_text=True)
    assert '<strong id="matching">2</strong>' in html
    assert all(d in html for d in dead_1) and not any(d in html for d in dead_2 | dead_own | dead_other)
    assert f'<option value="{sub_1}"' in html and f'<option value="{sub_2}"' not in html  # its endpoints to pick

    auth.login("owner")  # an owner's own team, unpicked
    html = client.get("/dead-letters?consumer=cus_1").get_data(as_text=True)
    assert '<strong id="matching">2</strong>' in html and "Replay the 2 matching" in html
    resp = client.post("/dead-letters/replay", data={"csrf_token": auth.csrf(), "which": "matching",
                                                      "consumer": "cus_1", "team": str(team)})
    assert resp.status_code in (200, 302)
    replay = db.session.scalar(select(Replay))
    assert replay.total == 2 and replay.filter["consumer"] == "cus_1" and replay.filter["team_id"] == team
