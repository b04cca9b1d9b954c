"""Bad input is a 4xx that says what is wrong, never a 500, and nothing is stored half-way.

Each case here was a 500 (or, worse, accepted) before: deep nesting, integers beyond a column,
NaN and Infinity, the calendar's edges, NUL characters and unpaired surrogates, unparseable hosts.
Every test runs on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.models import Event, EventType, Subscription


def stored(model) -> int:
    return db.session.scalar(select(func.count()).select_from(model))


def post_raw(producer, path, text: str):
    """A body as exact text: json.dumps cannot write NaN the way a careless producer does, or nest 5,000 deep."""
    return producer.client.post(path, data=text, headers=producer.headers(**{"Content-Type": "application/json"}))


def assert_refused(resp, status, words):
    assert resp.status_code == status, (resp.status_code, resp.get_data(as_text=True)[:300])
    assert words in resp.get_json()["error"], resp.get_json()


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


# -- nesting deep enough for a RecursionError --------------------------------------------------

@pytest.mark.parametrize("path, text", [
    ("/api/v1/events", '{"type": "a.b", "data": {"x": %s}}' % nested(5000)),
    ("/api/v1/events", nested(5000)),
    ("/api/v1/events/batch", '{"events": [{"type": "a.b", "data": {"x": %s}}]}' % nested(5000)),
    ("/api/v1/subscriptions", '{"url": "https://example.com/", "event_types": %s}' % nested(5000, '"*"')),
    ("/api/v1/event-types", '{"name": "a.b", "schema": {"items": %s}}' % ('{"items": ' * 5000 + "{}" + "}" * 5000)),
    # 300 levels: json.loads read it, then checking it against the metaschema raised RecursionError
    ("/api/v1/event-types", '{"name": "a.b", "schema": %s}' % ('{"properties": {"a": ' * 150 + "{}" + "}}" * 150)),
])
def test_json_nested_beyond_any_parser_is_a_400(producer, path, text):
    assert_refused(post_raw(producer, path, text), 400, "nested")
    assert stored(Event) == stored(Subscription) == stored(EventType) == 0


def test_data_nested_deeper_than_a_thin_event_needs_is_refused(producer):
    resp = post_raw(producer, "/api/v1/events", '{"type": "a.b", "data": {"x": %s}}' % nested(100))
    assert_refused(resp, 422, "data is nested")
    assert stored(Event) == 0


def test_an_event_type_schema_nested_too_deep_to_check_is_refused(producer):
    schema: dict = {"type": "object"}
    for _ in range(50):  # 101 levels of JSON: the parser reads it, but the metaschema check recursed near the limit
        schema = {"type": "object", "properties": {"a": schema}}
    resp = producer.post("/api/v1/event-types", {"name": "a.b", "schema": schema})
    assert_refused(resp, 422, "nested")
    assert stored(EventType) == 0


@pytest.mark.parametrize("schema, words", [
    ({"$ref": "#"}, "refers to itself"),                                    # validation would recurse forever
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"},
     "refers to itself"),                                                   # a cycle through two definitions
    ({"$ref": "https://example.com/schema.json"}, "only to itself"),        # never fetched: no SSRF through $ref
    ({"properties": {"a": {"$ref": "#/$defs/missing"}}}, "cannot be resolved"),
])
def test_an_event_type_schema_that_cannot_validate_data_is_refused(producer, schema, words):
    resp = producer.post("/api/v1/event-types", {"name": "a.b", "schema": schema})
    assert_refused(resp, 422, words)
    assert producer.post("/api/v1/events", {"type": "a.b", "data": {"a": {}}}).status_code == 202


# -- integers beyond the column ------------------------------------------------------------------

@pytest.mark.parametrize("version", [2 ** 31, 2 ** 63, 10 ** 30])
def test_a_version_beyond_the_column_is_a_400(producer, version):
    assert_refused(producer.post("/api/v1/events", {"type": "a.b", "version": version}), 400, "version")
    assert_refused(producer.post("/api/v1/event-types", {"name": "a.b", "version": version, "schema": {}}),
                   400, "version")
    assert_refused(producer.post("/api/v1/subscriptions", {"url": "https://example.com/",
                                                           "event_versions": {"a.b": version}}),
                   400, "event_versions")
    assert stored(Event) == stored(EventType) == stored(Subscription) == 0


# -- NaN and Infinity ----------------------------------------------------------------------------

@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400", "-1e999"])
def test_nan_and_infinity_in_data_are_refused_and_never_reach_a_receiver(producer, receiver, literal):
    producer.subscribe(receiver.url + "/ok")
    resp = post_raw(producer, "/api/v1/events", '{"type": "a.b", "data": {"x": [1, %s]}}' % literal)
    assert_refused(resp, 400, "NaN")
    assert stored(Event) == 0


def test_nan_is_refused_wherever_a_number_is_expected(producer):
    resp = post_raw(producer, "/api/v1/subscriptions", '{"url": "https://example.com/", "connect_timeout": NaN}')
    assert_refused(resp, 400, "connect_timeout")
    assert stored(Subscription) == 0


# -- the calendar's edges --------------------------------------------------------------------------

@pytest.mark.parametrize("timestamp", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"])
def test_a_time_that_leaves_the_calendar_in_utc_is_refused(producer, timestamp):
    resp = producer.post("/api/v1/events", {"type": "a.b", "timestamp": timestamp})
    assert_refused(resp, 422, "timestamp")
    assert stored(Event) == 0


@pytest.mark.parametrize("timestamp, sent", [("0001-01-01T12:00:00+10:00", "0001-01-01T02:00:00.000Z"),
                                             ("9999-12-31T20:00:00.5-03:59", "9999-12-31T23:59:00.500Z"),
                                             ("0999-06-01T00:00:00Z", "0999-06-01T00:00:00.000Z")])
def test_a_time_near_the_calendars_edges_is_written_as_rfc_3339(producer, timestamp, sent):
    event_id = producer.post("/api/v1/events", {"type": "a.b", "timestamp": timestamp}).get_json()["id"]
    assert producer.get(f"/api/v1/events/{event_id}").get_json()["timestamp"] == sent
    assert json.loads(db.session.scalar(select(Event.body)))["timestamp"] == sent


# -- NUL characters and unpaired surrogates ----------------------------------------------------------

@pytest.mark.parametrize("path, payload, words", [
    ("/api/v1/subscriptions", {"url": "https://example.com/", "description": "a\u0000b"}, "description"),
    ("/api/v1/subscriptions", {"url": "https://example.com/\u0000"}, "url"),
    ("/api/v1/subscriptions", {"url": "https://example.com/", "event_types": ["a\u0000"]}, "event_types"),
    ("/api/v1/event-types", {"name": "a.b", "schema": {}, "description": "a\u0000b"}, "description"),
    ("/api/v1/event-types", {"name": "a\u0000b", "schema": {}}, "name"),
    ("/api/v1/events", {"type": "a\u0000b"}, "type"),
    ("/api/v1/events", {"type": "a.b", "id": "a\u0000b"}, "id"),
])
def test_nul_in_a_text_field_is_a_400(producer, path, payload, words):
    assert_refused(producer.post(path, payload), 400, words)
    assert stored(Event) == stored(EventType) == stored(Subscription) == 0


def test_nul_in_event_data_is_a_422_that_says_where_and_a_batch_stores_nothing(producer, receiver):
    # PostgreSQL refuses NUL in text and jsonb: this was a 500 there.
    producer.subscribe(receiver.url + "/ok")
    for data, where in [({"resource_id": "a\u0000b"}, "data.resource_id"),
                        ({"items": [{"ok": 1}, {"name": "x\u0000"}]}, "data.items[1].name"),
                        ({"odd key": ["\u0000"]}, 'data["odd key"][0]'),
                        ({"k\u0000": 1}, "data has a key")]:
        assert_refused(producer.post("/api/v1/events", {"type": "a.b", "data": data}), 422, where)
    batch = {"events": [{"type": "a.b", "data": {"resource_id": "fine"}},
                        {"type": "a.b", "data": {"resource_id": "a\u0000b"}}]}
    assert_refused(producer.post("/api/v1/events/batch", batch), 422, "events[1]: data.resource_id")
    # A literal backslash-u-0000 is six ordinary characters, and is stored.
    assert producer.post("/api/v1/events", {"type": "a.b", "data": {"note": "\\u0000"}}).status_code == 202
    assert stored(Event) == 1


def test_nul_in_the_idempotency_key_is_a_400(producer):
    assert_refused(producer.post("/api/v1/events", {"type": "a.b"}, headers={"Idempotency-Key": "k\x00"}),
                   400, "Idempotency-Key")
    assert stored(Event) == 0


def test_an_unpaired_surrogate_in_a_text_field_is_a_400(producer):
    resp = post_raw(producer, "/api/v1/subscriptions", '{"url": "https://example.com/", "description": "a\\ud800b"}')
    assert resp.status_code == 400, resp.get_data(as_text=True)[:300]
    assert stored(Subscription) == 0


def test_nul_in_a_path_segment_or_a_query_is_a_400(producer, receiver):
    sub = producer.subscribe(receiver.url + "/ok")
    for path in ("/api/v1/events/a%00b", "/api/v1/subscriptions/a%00b", "/api/v1/subscriptions/a%00b/contract",
                 f"/api/v1/subscriptions/{sub['id']}/deliveries?before=%00",
                 f"/api/v1/subscriptions/{sub['id']}/deliveries?before=dlv_%00z"):
        assert_refused(producer.get(path), 400, "NUL")
    assert_refused(producer.post("/api/v1/subscriptions/a%00b/pause"), 400, "NUL")


def test_nul_in_a_dashboard_path_or_query_is_a_400(client, auth, users, producer, receiver):
    sub = producer.subscribe(receiver.url + "/ok")
    auth.login("operator")
    for path in ("/subscriptions/a%00b", "/deliveries/a%00b", "/subscriptions/a%00b/contract",
                 f"/subscriptions/{sub['id']}?before=dlv_%00"):
        assert client.get(path).status_code == 400, path
    assert client.post("/subscriptions/a%00b/pause", data={"csrf_token": auth.csrf()}).status_code == 400
    assert client.get(f"/subscriptions/{sub['id']}").status_code == 200


# -- hosts nothing can parse ---------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["http://[::1/hook", "http://[fe80::1%25zz]x/", "http://\u2100.example/",
                                 "http://" + "a" * 64 + ".example/", "http://example.com:70000/"])
def test_a_url_whose_host_cannot_be_parsed_is_a_422(producer, url):
    assert_refused(producer.post("/api/v1/subscriptions", {"url": url}), 422, "url")
    assert stored(Subscription) == 0


# -- methods ------------------------------------------------------------------------------------------

def test_a_405_says_which_methods_are_allowed(producer):
    resp = producer.client.delete("/api/v1/events", headers=producer.headers())
    assert resp.status_code == 405 and resp.get_json()["error"]
    assert set(resp.headers["Allow"].split(", ")) >= {"POST"}
    resp = producer.client.put("/api/v1/team", headers=producer.headers())
    assert {"GET", "PATCH"} <= set(resp.headers["Allow"].split(", "))
