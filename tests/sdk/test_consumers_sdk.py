"""Consumers in both SDKs: the producer client upserts a consumer and addresses events to it (single and
batch, against the real service), and the receiver SDK reads the consumer a real delivery is for."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from promesa_producer import Client, Consumer, Rejected
from promesa_receiver import CONSUMER_HEADER, MalformedSignature, consumer_of, verify

from dashboard.core.extensions import db
from dashboard.models import Event

from tests.support.pipeline import deliver_due

from .producer_fixtures import live_url, proxy, sleeps  # noqa: F401  (fixtures)


def addressed(team) -> dict[str, str | None]:
    """event id -> the uid of the consumer it was addressed to, as the service stored it."""
    db.session.rollback()  # read what the server's threads committed
    return {e.id: e.consumer.uid if e.consumer else None
            for e in db.session.scalars(sa.select(Event).where(Event.team_id == team.id))}


# -- the producer client --------------------------------------------------------------------------
def test_put_consumer_creates_then_updates(live_url, producer, sleeps):
    client = Client(live_url, producer.token, sleep=sleeps)
    made = client.put_consumer("cus_8812", name="Acme Corp", metadata={"plan": "pro"})
    assert made == Consumer("cus_8812", "Acme Corp", {"plan": "pro"}, "active", 0, created=True)
    again = client.put_consumer("cus_8812", state="disabled")
    assert again == Consumer("cus_8812", "Acme Corp", {"plan": "pro"}, "disabled", 0, created=False)
    assert producer.get("/api/v1/consumers/cus_8812").get_json()["state"] == "disabled"


def test_put_consumer_is_retried_through_a_lost_answer_and_makes_one_consumer(proxy, producer, sleeps):
    proxy.script = [(503, {"Retry-After": "2"}), "pass then drop"]
    made = Client(proxy.url, producer.token, sleep=sleeps).put_consumer("cus_1", name="One")
    assert [s.answered for s in proxy.seen] == [503, None, 200]
    assert sleeps[0] == 2 and (made.uid, made.name, made.created) == ("cus_1", "One", False)  # the lost 201
    assert [c["uid"] for c in producer.get("/api/v1/consumers").get_json()["data"]] == ["cus_1"]


def test_put_consumer_refusals_are_typed(live_url, producer, sleeps):
    client = Client(live_url, producer.token, sleep=sleeps)
    with pytest.raises(Rejected) as refused:
        client.put_consumer("not a uid")
    assert refused.value.status == 422 and "1 to 100 letters" in refused.value.error
    with pytest.raises(Rejected) as too_big:
        client.put_consumer("cus_1", metadata={"notes": "x" * 5000})
    assert too_big.value.status == 413 and sleeps == []  # an answer that will not change is not retried


def test_publish_and_publish_many_address_events_to_a_consumer(live_url, producer, receiver, sleeps):
    client = Client(live_url, producer.token, sleep=sleeps)
    for uid in ("cus_a", "cus_b"):
        client.put_consumer(uid)
        producer.subscribe(f"{receiver.url}/{uid}", consumer=uid)
    one = client.publish("invoice.paid", {"resource_id": "in_1"}, id="e1", consumer="cus_a")
    assert one.deliveries == 1
    many = client.publish_many([{"type": "invoice.paid", "id": "e2", "consumer": "cus_b"},
                                {"type": "invoice.paid", "id": "e3", "consumer": "cus_a"},
                                {"type": "invoice.paid", "id": "e4"}])
    assert [p.deliveries for p in many] == [1, 1, 0]  # e4 is for the team's own endpoints: it has none
    assert addressed(producer.team) == {"e1": "cus_a", "e2": "cus_b", "e3": "cus_a", "e4": None}


def test_an_unknown_consumer_is_refused_naming_it(live_url, producer, sleeps):
    client = Client(live_url, producer.token, sleep=sleeps)
    with pytest.raises(Rejected) as refused:
        client.publish("invoice.paid", consumer="cus_nobody")
    assert refused.value.status == 422 and "cus_nobody" in refused.value.error
    with pytest.raises(Rejected) as in_batch:
        client.publish_many([{"type": "invoice.paid"}, {"type": "invoice.paid", "consumer": "cus_nobody"}])
    assert in_batch.value.index == 1 and addressed(producer.team) == {}


def test_an_event_field_the_service_does_not_know_is_still_refused_locally():
    client = Client("http://127.0.0.1:9", "tok")
    with pytest.raises(ValueError, match="unknown event fields: tenant"):
        client.publish_many([{"type": "x", "tenant": "cus_1"}])


# -- the receiver SDK -----------------------------------------------------------------------------
def test_a_real_delivery_names_its_consumer_outside_the_signature(app, producer, receiver, clock):
    producer.put_consumer("cus_a")
    mine = producer.subscribe(receiver.url + "/cus_a", consumer="cus_a")
    own = producer.subscribe(receiver.url + "/team")
    for event in ({"id": "for_a", "consumer": "cus_a"}, {"id": "for_team"}):
        assert producer.post("/api/v1/events", {"type": "invoice.paid", "data": {}, **event}).status_code == 202
    deliver_due(app, clock)
    got = {r.path: r for r in receiver.requests}
    assert set(got) == {"/cus_a", "/team"}
    for path, secret in (("/cus_a", mine["secret"]), ("/team", own["secret"])):
        verify(got[path].body, got[path].headers["X-Signature"], secret, now=clock.now().timestamp())
    assert consumer_of(got["/cus_a"].headers) == "cus_a"
    assert consumer_of(got["/team"].headers) is None
    assert "cus_a" not in got["/cus_a"].body.decode()  # the body gains nothing
    assert set(json.loads(got["/cus_a"].body)) == set(json.loads(got["/team"].body))


@pytest.mark.parametrize("headers, uid", [
    ({"X-Promesa-Consumer": "cus_1"}, "cus_1"),
    ({"x-promesa-consumer": " cus_1 "}, "cus_1"),
    ([("X-Signature", "t=1,v1=ab"), ("X-PROMESA-CONSUMER", "cus:1")], "cus:1"),
    ({"X-Promesa-Consumer": ""}, None),
    ({"X-Signature": "t=1,v1=ab"}, None),
])
def test_consumer_of_reads_the_header_whatever_its_case(headers, uid):
    assert CONSUMER_HEADER == "X-Promesa-Consumer"
    assert consumer_of(headers) == uid


def test_consumer_of_refuses_two_different_values():
    with pytest.raises(MalformedSignature, match="given twice"):
        consumer_of([("X-Promesa-Consumer", "cus_1"), ("x-promesa-consumer", "cus_2")])


def test_the_producer_client_hands_out_a_portal_link_and_revokes_it(app, live_url, producer, sleeps):
    client = Client(live_url, producer.token, sleep=sleeps)
    client.put_consumer("cus_8812")
    link = client.portal_link("cus_8812", expires_in=600)
    assert "/portal/in/" in link.url and link.expires_at.endswith("Z")
    browser = app.test_client()
    assert browser.get("/portal/" + link.url.split("/portal/", 1)[1]).status_code == 302
    assert browser.get("/portal/").status_code == 200
    assert client.revoke_portal_sessions("cus_8812") == 1
    assert browser.get("/portal/").status_code == 401
    with pytest.raises(Rejected) as refused:
        client.portal_link("cus_nobody")
    assert refused.value.status == 404
