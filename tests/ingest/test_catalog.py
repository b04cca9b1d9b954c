"""The event-type catalog: schemas for data, versions, strict mode, a subscription's chosen version."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.models import Event

from tests.support.pipeline import deliver_due

FILE_V1 = {"type": "object", "required": ["resource_id", "resource_version"], "additionalProperties": False,
           "properties": {"resource_id": {"type": "string"}, "resource_version": {"type": "integer"}}}
FILE_V2 = {"type": "object", "required": ["file_id", "revision"],
           "properties": {"file_id": {"type": "string"}, "revision": {"type": "integer"}}}


def events_stored():
    return db.session.scalar(select(func.count()).select_from(Event))


def declare(producer, name="file.updated", version=1, schema=FILE_V1, **extra):
    return producer.post("/api/v1/event-types", {"name": name, "version": version, "schema": schema, **extra})


def test_it_declares_and_lists_types(producer):
    resp = declare(producer, description="a file changed")
    assert resp.status_code == 201 and resp.get_json()["version"] == 1
    assert declare(producer, version=2, schema=FILE_V2).status_code == 201
    listed = producer.get("/api/v1/event-types").get_json()["data"]
    assert [(t["name"], t["version"]) for t in listed] == [("file.updated", 1), ("file.updated", 2)]


def test_versions_are_immutable(producer):
    declare(producer)
    resp = declare(producer, schema={"type": "object"})
    assert resp.status_code == 409 and "declare version 2" in resp.get_json()["error"]


@pytest.mark.parametrize("payload, status, words", [
    ({"name": "file.updated"}, 400, "missing required field(s): schema"),
    ({"name": "bad name", "schema": {}}, 400, "name must be"),
    ({"name": "a.b", "version": 0, "schema": {}}, 400, "version must be"),
    ({"name": "a.b", "schema": []}, 400, "schema must be a JSON Schema object"),
    ({"name": "a.b", "schema": {"type": "nonsense"}}, 422, "not a valid JSON Schema"),
    ({"name": "a.b", "schema": {}, "owner": "me"}, 400, "unknown field(s): owner"),
])
def test_it_rejects_bad_declarations(producer, payload, status, words):
    resp = producer.post("/api/v1/event-types", payload)
    assert resp.status_code == status and words in resp.get_json()["error"]
    assert producer.get("/api/v1/event-types").get_json()["data"] == []


def test_ingest_validates_data_against_the_schema_naming_the_field(producer, receiver):
    producer.subscribe(receiver.url + "/ok")
    declare(producer)
    resp = producer.post("/api/v1/events", {"type": "file.updated",
                                            "data": {"resource_id": "f_1", "resource_version": "seven"}})
    assert resp.status_code == 422
    error = resp.get_json()["error"]
    assert error.startswith("data.resource_version:") and "integer" in error and "file.updated v1" in error
    resp = producer.post("/api/v1/events", {"type": "file.updated", "data": {"resource_id": "f_1"}})
    assert resp.status_code == 422 and "resource_version" in resp.get_json()["error"]
    assert events_stored() == 0
    ok = producer.post("/api/v1/events", {"type": "file.updated",
                                          "data": {"resource_id": "f_1", "resource_version": 7}})
    assert ok.status_code == 202 and events_stored() == 1


def test_strict_mode_rejects_undeclared_types(producer):
    assert producer.post("/api/v1/events", {"type": "anything.goes"}).status_code == 202
    resp = producer.client.patch("/api/v1/team", json={"strict_event_types": True}, headers=producer.headers())
    assert resp.status_code == 200 and resp.get_json()["strict_event_types"] is True
    resp = producer.post("/api/v1/events", {"type": "anything.goes"})
    assert resp.status_code == 422 and "not declared" in resp.get_json()["error"]
    declare(producer, name="anything.goes", schema={"type": "object"})
    assert producer.post("/api/v1/events", {"type": "anything.goes"}).status_code == 202
    resp = producer.post("/api/v1/events", {"type": "anything.goes", "version": 3})
    assert resp.status_code == 422 and "version 3 is not declared" in resp.get_json()["error"]
    assert events_stored() == 2


def test_a_subscription_receives_the_version_it_chose(app, producer, receiver, clock):
    declare(producer)
    declare(producer, version=2, schema=FILE_V2)
    producer.subscribe(receiver.url + "/ok", event_versions={"file.updated": 1})
    producer.subscribe(receiver.url + "/status/200", event_versions={"file.updated": 2})
    producer.subscribe(receiver.url + "/status/202")  # not pinned: every version
    v1 = producer.post("/api/v1/events", {"type": "file.updated", "version": 1,
                                          "data": {"resource_id": "f_1", "resource_version": 7}}).get_json()
    v2 = producer.post("/api/v1/events", {"type": "file.updated",
                                          "data": {"file_id": "f_1", "revision": 7}}).get_json()
    assert (v1["deliveries"], v2["deliveries"]) == (2, 2)
    deliver_due(app, clock)
    by_path = {}
    for r in receiver.requests:
        body = json.loads(r.body)
        by_path.setdefault(r.path, []).append((body["id"], body["version"]))
    assert by_path["/ok"] == [(v1["id"], 1)]
    assert by_path["/status/200"] == [(v2["id"], 2)]  # no version given: the latest declared one
    assert sorted(by_path["/status/202"]) == sorted([(v1["id"], 1), (v2["id"], 2)])


def test_bad_event_versions_on_a_subscription(producer, receiver):
    resp = producer.post("/api/v1/subscriptions", {"url": receiver.url + "/ok", "event_versions": {"a.b": "2"}})
    assert resp.status_code == 400 and "event_versions" in resp.get_json()["error"]
