"""The catalog costs other teams nothing: a schema's validation cost is bounded at declaration and per event,
each schema is compiled once per web process, the catalog has quotas and a rate, and its list is paged."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.ingest import catalog, quotas
from dashboard.ingest.accept import Declared
from dashboard.models import Event, EventType


def doubling(depth: int, leaf: dict | None = None) -> dict:
    """The reviewer's schema: each level names the next twice, so following the $refs doubles it per level."""
    defs = {f"l{i}": {"allOf": [{"$ref": f"#/$defs/l{i + 1}"}, {"$ref": f"#/$defs/l{i + 1}"}]} for i in range(depth)}
    defs[f"l{depth}"] = leaf or {"type": "object"}
    return {"$defs": defs, "$ref": "#/$defs/l0"}


def declare(producer, schema, name="file.updated", version=1, **extra):
    return producer.post("/api/v1/event-types", {"name": name, "version": version, "schema": schema, **extra})


def events_stored() -> int:
    return db.session.scalar(select(func.count()).select_from(Event))


@pytest.mark.parametrize("depth", [14, 24])
def test_a_doubling_schema_is_refused_at_declaration_naming_ref_expansion(producer, depth):
    started = time.process_time()
    resp = declare(producer, doubling(depth))
    assert time.process_time() - started < 0.5
    assert resp.status_code == 422
    error = resp.get_json()["error"]
    assert "($ref expansion)" in error and f"the cap of {catalog.MAX_SCHEMA_EXPANSION}" in error
    assert f"expands to {catalog.expansion(doubling(depth))[0]} subschemas" in error
    assert db.session.scalar(select(func.count()).select_from(EventType)) == 0


def test_a_schema_at_the_caps_is_accepted_and_validates(producer, receiver):
    producer.subscribe(receiver.url + "/ok")
    schema = doubling(7, {"type": "object", "required": ["resource_id"]})
    schema["properties"] = {}
    padding = catalog.MAX_SCHEMA_EXPANSION - catalog.expansion(schema)[0]
    schema["properties"] = {f"p{n}": {"type": "integer"} for n in range(padding)}
    assert catalog.expansion(schema)[0] == catalog.MAX_SCHEMA_EXPANSION
    over = {**schema, "properties": {**schema["properties"], "one_more": {"type": "integer"}}}
    resp = declare(producer, over)
    assert resp.status_code == 422 and "1 past the cap" in resp.get_json()["error"]
    assert declare(producer, schema).status_code == 201
    producer.publish(data={"resource_id": "f_1", "p0": 1})
    refused = producer.post("/api/v1/events", {"type": "file.updated", "data": {"resource_id": "f_1", "p0": "x"}})
    assert refused.status_code == 422 and refused.get_json()["error"].startswith("data.p0:")


def test_a_ref_that_descends_without_end_is_bounded_by_depth(producer):
    """A chain of $refs each one level deeper is nested past the cap once followed, though small as written."""
    levels = 64  # three JSON levels each once followed: 192, past MAX_EXPANDED_DEPTH
    defs = {f"l{i}": {"properties": {"a": {"$ref": f"#/$defs/l{i + 1}"}}} for i in range(levels)}
    defs[f"l{levels}"] = {}
    resp = declare(producer, {"$defs": defs, "$ref": "#/$defs/l0"})
    assert resp.status_code == 422 and "($ref depth)" in resp.get_json()["error"]


def test_a_ref_back_to_the_root_through_the_data_is_a_tree_and_is_accepted(producer, receiver):
    """Recursion that descends into the data ends with the data; only a cycle in place is refused."""
    tree = {"type": "object", "properties": {"resource_id": {"type": "string"},
                                              "children": {"type": "array", "items": {"$ref": "#"}}}}
    assert declare(producer, tree).status_code == 201
    producer.publish(data={"resource_id": "f_1", "children": [{"resource_id": "f_2", "children": []}]})
    refused = producer.post("/api/v1/events", {"type": "file.updated",
                                               "data": {"resource_id": "f_1", "children": [{"resource_id": 2}]}})
    assert refused.status_code == 422 and "children" in refused.get_json()["error"]


def test_each_declaration_is_compiled_once_per_web_process(app, producer, receiver):
    producer.subscribe(receiver.url + "/ok")
    compiled = catalog.Compiled.for_app(app)
    assert declare(producer, {"type": "object", "properties": {"resource_id": {"type": "string"}}}).status_code == 201
    assert compiled.compiled == 1  # at declaration
    for n in range(5):
        producer.publish(data={"resource_id": f"f_{n}"})
    batch = producer.post("/api/v1/events/batch", {"events": [
        {"type": "file.updated", "data": {"resource_id": "f_9"}}, {"type": "other.thing", "data": {}}]})
    assert batch.status_code == 202
    assert producer.post("/api/v1/events", {"type": "file.updated", "data": {"resource_id": 7}}).status_code == 422
    assert compiled.compiled == 1
    assert declare(producer, {"type": "object"}, version=2).status_code == 201
    producer.publish(data={"resource_id": "v2"})
    producer.post("/api/v1/events", {"type": "file.updated", "version": 1, "data": {"resource_id": "v1"}})
    assert compiled.compiled == 2  # one per version
    compiled.validators.clear()  # (as when the process starts, or the declaration was evicted)
    producer.publish(data={"resource_id": "again"})
    producer.publish(data={"resource_id": "and again"})
    assert compiled.compiled == 3


def test_the_per_event_budget_refuses_a_costly_event_and_stores_nothing(producer, receiver):
    producer.subscribe(receiver.url + "/ok")
    # Each item walks some 250 subschemas: a cheap schema for a few items, not for a hundred.
    schema = doubling(6)
    schema.update({"type": "object", "properties": {"ids": {"type": "array", "items": {"$ref": "#/$defs/l0"}}}})
    schema["$defs"]["l6"] = {"type": "integer"}
    del schema["$ref"]
    assert declare(producer, schema).status_code == 201
    producer.publish(data={"ids": list(range(10))})
    stored = events_stored()
    started = time.process_time()
    resp = producer.post("/api/v1/events", {"type": "file.updated", "data": {"ids": list(range(200))}})
    assert time.process_time() - started < 1
    assert resp.status_code == 422
    assert "the budget of one event" in resp.get_json()["error"]
    assert events_stored() == stored
    batch = producer.post("/api/v1/events/batch", {"events": [
        {"type": "file.updated", "data": {"ids": [1]}}, {"type": "file.updated", "data": {"ids": list(range(200))}}]})
    assert batch.status_code == 422 and batch.get_json()["error"].startswith("events[1]: ")
    assert events_stored() == stored
    # Each within one event's budget, together past one request's: a batch cannot multiply it.
    near = {"type": "file.updated", "data": {"ids": list(range(15))}}
    assert producer.post("/api/v1/events/batch", {"events": [near] * 3}).status_code == 202
    batch = producer.post("/api/v1/events/batch", {"events": [near] * 14})
    assert batch.status_code == 422 and "the budget of one request's events" in batch.get_json()["error"]
    assert events_stored() == stored + 3


def test_the_budget_is_work_an_enum_weighs_its_length_and_unique_items_is_linear(app):
    """Validation beside ingest, on a declaration as ingest reads it (its id is no stored row's)."""
    big_enum = Declared(-1, "big.enum", 1, {"type": "array", "items": {"enum": list(range(4_000))}})
    unique = Declared(-2, "unique.items", 1, {"type": "array", "uniqueItems": True})
    with app.app_context():
        with pytest.raises(ApiError, match="the budget of one event"):
            catalog.validate_data(big_enum, [3_999] * 100)
        started = time.process_time()  # pairwise, 8 million comparisons: seconds
        catalog.validate_data(unique, [{"a": n} for n in range(4_000)])
        assert time.process_time() - started < 1
        with pytest.raises(ApiError, match="non-unique"):
            catalog.validate_data(unique, [{"a": 1}, {"a": 1.0}])
        catalog.validate_data(unique, [1, True])  # true is not 1 in JSON Schema


def test_the_catalog_quotas_refuse_the_flood(producer, clock):
    """The reviewer's flood: 150 types with 60 KB descriptions. Refused past catalog_bytes (413), and past
    declarations_per_minute (429 with Retry-After) whatever their size."""
    description = "x" * 60_000
    answers = [declare(producer, {"type": "object", "description": description}, name=f"flood.t{n}")
               for n in range(150)]
    codes = [a.status_code for a in answers]
    first_refused = codes.index(413)
    assert codes[:first_refused] == [201] * first_refused and first_refused == 33  # 33 × 60 KB ≤ 2,000,000
    body = answers[first_refused].get_json()
    assert (body["quota"], body["limit"]) == ("catalog_bytes", 2_000_000) and "catalog_bytes" in body["error"]
    rated = answers[60]
    assert codes[60:] == [429] * 90 and rated.get_json()["quota"] == "declarations_per_minute"
    assert rated.headers["Retry-After"] == str(rated.get_json()["retry_after_seconds"])
    used = quotas.describe(producer.team)
    assert used["catalog_bytes"]["used"] <= 2_000_000 and used["event_types"]["used"] == 33
    assert db.session.scalar(select(func.count()).select_from(EventType)) == 33

    clock.advance(seconds=60)  # a new minute: the rate lets declarations in again, the bytes quota does not
    quotas.set_override(producer.team, "event_types", 34, actor=("system", "test"))
    assert declare(producer, {"type": "object"}, name="small.one").status_code == 201
    refused = declare(producer, {"type": "object"}, name="small.two")
    assert refused.status_code == 409 and refused.get_json()["quota"] == "event_types"
    quotas.set_override(producer.team, "event_type_versions", 2, actor=("system", "test"))
    assert declare(producer, {"type": "object"}, name="small.one", version=2).status_code == 201
    refused = declare(producer, {"type": "object"}, name="small.one", version=3)
    assert refused.status_code == 409 and refused.get_json()["quota"] == "event_type_versions"
    shown = producer.get("/api/v1/team").get_json()["quotas"]
    assert (shown["event_types"]["used"], shown["event_type_versions"]["used"]) == (34, 2)


def test_the_catalog_list_is_paged(producer, client, auth, users):
    for n in range(5):
        assert declare(producer, {"type": "object"}, name=f"paged.t{n}").status_code == 201
    seen, after, pages = [], None, 0
    while True:
        resp = producer.get("/api/v1/event-types", query_string={"limit": 2, **({"after": after} if after else {})})
        assert resp.status_code == 200
        body = resp.get_json()
        assert len(body["data"]) <= 2
        seen += [t["name"] for t in body["data"]]
        pages, after = pages + 1, body["next_after"]
        if after is None:
            break
    assert (seen, pages) == ([f"paged.t{n}" for n in range(5)], 3)
    assert producer.get("/api/v1/event-types").get_json()["next_after"] is None  # 50 by default
    for bad in ({"limit": 0}, {"limit": 101}, {"after": "x"}, {"after": "9" * 10}):  # (ids are 32-bit)
        assert producer.get("/api/v1/event-types", query_string=bad).status_code == 400
    auth.login("owner")  # the New subscription form offers the catalog's names (its schemas are not read)
    page = client.get("/subscriptions/new").get_data(as_text=True)
    assert all(f'value="paged.t{n}"' in page for n in range(5))
    doc = producer.client.get("/api/v1/openapi.json").get_json()
    listed = doc["paths"]["/event-types"]["get"]
    assert {p["name"] for p in listed["parameters"]} >= {"limit", "after"}
    assert set(doc["paths"]["/event-types"]["post"]["responses"]) >= {"413", "422", "429"}
