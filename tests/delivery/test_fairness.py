"""One team never slows, stalls or reads another: its schemas, its patterns, its event ids."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.models import Event, EventType

BACKTRACKING = "^(a+)+$"  # Python's re takes 2^n steps on "a" * n + "!"


def test_a_backtracking_pattern_is_matched_in_linear_time(producer):
    """With Python's re this ingest would run for longer than the universe has existed (2^8000 steps),
    in a web thread every team shares; RE2 answers at once."""
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": BACKTRACKING}},
              "patternProperties": {BACKTRACKING: {"type": "integer"}}}
    assert producer.post("/api/v1/event-types", {"name": "a.b", "schema": schema}).status_code == 201
    resp = producer.post("/api/v1/events", {"type": "a.b", "data": {"code": "a" * 8000 + "!"}})
    assert resp.status_code == 422 and "does not match" in resp.get_json()["error"]
    resp = producer.post("/api/v1/events", {"type": "a.b", "data": {"a" * 4000: "not an integer"}})
    assert resp.status_code == 422 and "is not of type 'integer'" in resp.get_json()["error"]
    assert producer.post("/api/v1/events", {"type": "a.b", "data": {"code": "aaaa", "aa": 2}}).status_code == 202


@pytest.mark.parametrize("pattern", [r"^(a)\1$", r"^(?=a)a$", r"(?<!b)a", "(?P<x>a)(?P=x)"])
def test_a_pattern_re2_cannot_match_is_refused_at_declaration(producer, pattern):
    for schema in ({"properties": {"x": {"type": "string", "pattern": pattern}}},
                   {"patternProperties": {pattern: {}}},
                   {"propertyNames": {"pattern": pattern}}):
        resp = producer.post("/api/v1/event-types", {"name": "a.b", "schema": schema})
        assert resp.status_code == 422 and "RE2" in resp.get_json()["error"], resp.get_json()
    assert db.session.scalar(select(func.count()).select_from(EventType)) == 0


def test_a_pattern_inside_an_enum_is_data_not_a_pattern(producer):
    schema = {"enum": [{"pattern": r"(a)\1"}]}
    assert producer.post("/api/v1/event-types", {"name": "a.b", "schema": schema}).status_code == 201
    assert producer.post("/api/v1/events", {"type": "a.b", "data": {"pattern": r"(a)\1"}}).status_code == 202
    assert db.session.scalar(select(func.count()).select_from(Event)) == 1


@pytest.mark.parametrize("fields, words", [
    ({"event_types": ["file.*"] * 101}, "at most 100 type names or patterns"),
    ({"event_types": ["file.[a-z]*"]}, "type names or patterns"),
    ({"event_types": ["file?"]}, "type names or patterns"),
    ({"event_types": ["has space"]}, "type names or patterns"),
    ({"event_types": ["x" * 201]}, "type names or patterns"),
    ({"event_versions": {f"type.{n}": 1 for n in range(101)}}, "at most 100 event types"),
    ({"event_versions": {"file.*": 2}}, "event_versions must be an object mapping"),
    ({"event_versions": {"": 2}}, "event_versions must be an object mapping"),
])
def test_routing_follows_the_type_grammar_and_a_count_limit(producer, fields, words):
    """20,000 patterns made each of that team's ingests take over a second: a hundred is the cap."""
    from dashboard.models import Subscription

    resp = producer.post("/api/v1/subscriptions", {"url": "https://example.com/", **fields})
    assert resp.status_code == 400 and words in resp.get_json()["error"], resp.get_json()
    assert db.session.scalar(select(func.count()).select_from(Subscription)) == 0


def test_routing_at_the_limits_is_accepted(producer):
    resp = producer.post("/api/v1/subscriptions", {
        "url": "https://example.com/", "event_types": [f"type.{n}.*" for n in range(100)],
        "event_versions": {f"type.{n}.x": 1 for n in range(100)}})
    assert resp.status_code == 201, resp.get_json()
