"""The payload filter's language (dashboard.core.filters) and where the API takes it: POST /filters/test, and
"filter" on creating, reading and editing a subscription (422 naming where a filter is wrong, null clears it)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dashboard.core import filters
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.models import AuditEntry, Subscription

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

EVENT = {"id": "evt_1", "type": "invoice.paid", "version": 2, "timestamp": "2026-12-06T10:00:00.000Z",
         "data": {"resource_id": "in_77", "region": "eu", "amount": 150, "rate": 0.5, "paid": True, "note": None,
                  "tags": ["a", "b"], "items": [{"sku": "x1"}, {"sku": "x2"}], "customer": {"tier": "gold"}}}


@pytest.mark.parametrize("spec, expected", [
    ({}, True),  # an empty filter: every event
    # a bare value is $eq, of any JSON type; equality is JSON's
    ({"data.region": "eu"}, True), ({"data.region": "us"}, False),
    ({"type": "invoice.paid", "version": 2}, True), ({"version": 1}, False),
    ({"data.amount": 150.0}, True),  # numbers by value
    ({"data.paid": 1}, False), ({"data.amount": True}, False),  # true is not 1
    ({"data.note": None}, True), ({"data.absent": None}, False),  # null is a value, not a missing path
    ({"data.tags": ["a", "b"]}, True), ({"data.tags": ["b", "a"]}, False), ({"data.tags": "a"}, False),
    ({"data.customer": {"$eq": {"tier": "gold"}}}, True), ({"data.customer.tier": "gold"}, True),
    ({"data.items.1.sku": "x2"}, True), ({"data.items.2.sku": "x2"}, False), ({"data.items.01.sku": "x2"}, False),
    ({"data.region.length": 2}, False),  # no path into a string
    # $eq $ne
    ({"data.region": {"$eq": "eu"}}, True), ({"data.region": {"$ne": "eu"}}, False),
    ({"data.region": {"$ne": "us"}}, True), ({"data.absent": {"$ne": "us"}}, True),
    ({"data.amount": {"$ne": "150"}}, True),
    # $in $nin
    ({"data.region": {"$in": ["us", "eu"]}}, True), ({"data.region": {"$in": ["us"]}}, False),
    ({"data.region": {"$in": []}}, False), ({"data.paid": {"$in": [1]}}, False), ({"data.amount": {"$in": [150.0]}}, True),
    ({"data.absent": {"$in": [None]}}, False), ({"data.note": {"$in": [None]}}, True),
    ({"data.region": {"$nin": ["us"]}}, True), ({"data.region": {"$nin": ["eu"]}}, False),
    ({"data.absent": {"$nin": ["eu"]}}, True),
    # $gt $gte $lt $lte: numbers with numbers, strings with strings, nothing else
    ({"data.amount": {"$gt": 100}}, True), ({"data.amount": {"$gt": 150}}, False), ({"data.amount": {"$gte": 150}}, True),
    ({"data.amount": {"$lt": 150.5}}, True), ({"data.amount": {"$lte": 149}}, False), ({"data.rate": {"$lt": 1}}, True),
    ({"data.amount": {"$gt": "100"}}, False), ({"data.region": {"$gt": 1}}, False), ({"data.paid": {"$gte": 0}}, False),
    ({"data.region": {"$gte": "eu", "$lt": "ev"}}, True),
    ({"timestamp": {"$gte": "2026-12-06T00:00:00Z", "$lt": "2026-12-07T00:00:00Z"}}, True),
    ({"data.absent": {"$lt": 10}}, False),
    # $exists
    ({"data.note": {"$exists": True}}, True), ({"data.absent": {"$exists": True}}, False),
    ({"data.absent": {"$exists": False}}, True), ({"data.region": {"$exists": False}}, False),
    # $and $or $not, and the members of a filter all holding
    ({"data.region": "eu", "data.amount": {"$gt": 1000}}, False),
    ({"$and": [{"data.region": "eu"}, {"data.amount": {"$gt": 100}}]}, True),
    ({"$and": [{"data.region": "eu"}, {"data.amount": {"$gt": 1000}}]}, False),
    ({"$or": [{"data.region": "us"}, {"data.amount": {"$gt": 100}}]}, True),
    ({"$or": [{"data.region": "us"}, {"data.amount": {"$gt": 1000}}]}, False),
    ({"$not": {"data.region": "eu"}}, False), ({"$not": {"data.absent": {"$gt": 1}}}, True),
    ({"$or": [{"type": "invoice.created"}, {"$and": [{"version": 2}, {"$not": {"data.customer.tier": "silver"}}]}]}, True),
])
def test_each_operator_means_what_the_docs_say(spec, expected):
    assert filters.matches(spec, EVENT) is expected


def test_the_limits_are_32_conditions_and_4_levels():
    thirty_two = {f"data.k{i}": {"$exists": False} for i in range(32)}
    assert filters.matches(thirty_two, EVENT) is True
    with pytest.raises(ApiError) as refused:
        filters.compile({**thirty_two, "data.k32": {"$exists": False}})
    assert refused.value.status == 422 and "at most 32 conditions" in refused.value.message
    # Two operators on one path count two.
    with pytest.raises(ApiError, match="at most 32 conditions"):
        filters.compile({f"data.k{i}": {"$gt": 0, "$lt": 9} for i in range(17)})

    four = {"$and": [{"$or": [{"$not": {"data.region": "us"}}]}]}  # the filter, $and's, $or's, $not's: 4 levels
    assert filters.matches(four, EVENT) is True
    with pytest.raises(ApiError) as refused:
        filters.compile({"$and": [{"$or": [{"$not": {"$and": [{"data.region": "eu"}]}}]}]})
    assert refused.value.status == 422
    assert refused.value.message.startswith("filter.$and[0].$or[0].$not.$and[0]: filters nest at most 4 levels")


@pytest.mark.parametrize("spec, message", [
    ({"$and": [{"data.region": "eu"}, {"data.amount": {"$gt": [1]}}]},
     "filter.$and[1].data.amount: $gt needs a number or a string"),
    ({"region": "eu"}, "filter.region: paths start at the event's body: id, type, version, timestamp, data "
                       "(like data.region)"),
    ({"data..region": "eu"}, "filter.data..region: a path is dotted keys"),
    ({"data.region": {"$regex": "^e"}}, "filter.data.region: $regex is not supported: filters have no regular "
                                        "expressions"),
    ({"data.region": {"$like": "e%"}}, "filter.data.region: unknown operator '$like'"),
    ({"$or": [{"data.a": 1}, {"$nor": []}]}, "filter.$or[1]: unknown operator '$nor'"),
    ({"$or": []}, "filter.$or: $or needs a non-empty list of filters"),
    ({"$and": {"data.a": 1}}, "filter.$and: $and needs a non-empty list of filters"),
    ({"$not": [{"data.a": 1}]}, "filter.$not: a filter is a JSON object"),
    ({"data.region": {"$in": "eu"}}, "filter.data.region: $in needs a list of values"),
    ({"data.region": {"$exists": "yes"}}, "filter.data.region: $exists needs true or false"),
    ({"data.region": {}}, "filter.data.region: an empty object tests nothing"),
    ({"data.customer": {"tier": "gold"}}, "filter.data.customer: 'tier' is not an operator; to compare with an "
                                          "object, use {\"$eq\": {...}}"),
    ({"$gt": 1}, "filter: $gt tests a path"),
    ({"data.a": {"$not": {"$gt": 1}}}, "filter.data.a: $not combines filters"),
    ({"data.a": "x\x00"}, "filter[\"data.a\"] must not contain NUL characters"),
    ({"data.a": {"$in": ["x" * 9000]}}, "filter: the filter is 9023 bytes as compact JSON; at most 8192"),
])
def test_a_wrong_filter_is_a_422_that_says_where(spec, message):
    with pytest.raises(ApiError) as refused:
        filters.compile(spec)
    assert refused.value.status == 422
    assert refused.value.message.startswith(message), refused.value.message


def test_a_stored_filter_is_compiled_once_by_its_text():
    filters.compiled_json.cache_clear()
    text = '{"data.region":"eu"}'
    first = filters.stored(text)
    assert filters.stored(text) is first and filters.compiled_json.cache_info().misses == 1
    assert filters.stored(None) is None and filters.stored("null") is None and filters.stored("{}") is None


def test_a_stored_filter_that_no_longer_compiles_lets_every_event_through(caplog):
    # Written under looser limits (or by hand): dropping the events its endpoint exists for would break a promise.
    too_many = "{" + ",".join(f'"data.k{i}":1' for i in range(40)) + "}"
    assert filters.stored(too_many) is None
    assert "no longer compiles" in caplog.text


# -- the API -------------------------------------------------------------------------------------------------------

def try_filter(producer, spec, event):
    return producer.post("/api/v1/filters/test", {"filter": spec, "event": event})


@sqlite_only
def test_the_test_route_answers_whether_an_event_matches(producer):
    resp = try_filter(producer, {"data.region": "eu", "data.amount": {"$gte": 100}}, EVENT)
    assert resp.status_code == 200 and resp.get_json() == {"matches": True}
    assert try_filter(producer, {"data.region": "us"}, EVENT).get_json() == {"matches": False}
    refused = try_filter(producer, {"$and": [{"data.region": "eu"}, {"data.amount": {"$gt": {"a": 1}}}]}, EVENT)
    assert refused.status_code == 422
    assert refused.get_json()["error"] == "filter.$and[1].data.amount: $gt needs a number or a string"
    assert try_filter(producer, "eu", EVENT).status_code == 400  # not an object: the document says so
    assert producer.client.post("/api/v1/filters/test", json={"filter": {}, "event": {}}).status_code == 401


@sqlite_only
def test_the_filter_is_documented_on_subscriptions_and_the_test_route(producer):
    document = producer.get("/api/v1/openapi.json").get_json()
    assert "/filters/test" in document["paths"]
    schemas = document["components"]["schemas"]
    assert "filter" in schemas["SubscriptionInput"]["properties"]
    assert "filter" in schemas["SubscriptionEdit"]["properties"]
    assert "filter" in schemas["Subscription"]["properties"]


def test_a_subscription_keeps_its_filter_and_an_edit_changes_or_clears_it_audited(app, producer, receiver):
    spec = {"data.region": "eu", "data.amount": {"$gte": 100}}
    sub = producer.subscribe(receiver.url + "/ok", filter=spec)
    assert sub["filter"] == spec
    assert producer.get(f"/api/v1/subscriptions/{sub['id']}").get_json()["filter"] == spec
    created = db.session.scalar(select(AuditEntry).where(AuditEntry.action == "subscription.created"))
    assert created.detail["filter"] == spec

    patch = producer.client.patch
    url, headers = f"/api/v1/subscriptions/{sub['id']}", producer.headers()
    refused = patch(url, json={"filter": {"$or": [{"data.region": "eu"}, {"region": "us"}]}, "description": "x"},
                    headers=headers)
    assert refused.status_code == 422
    assert refused.get_json()["error"].startswith("filter.$or[1].region: paths start at the event's body")
    db.session.expire_all()
    assert db.session.get(Subscription, sub["id"]).description == ""  # nothing stored

    changed = patch(url, json={"filter": {"data.region": "us"}}, headers=headers)
    assert changed.status_code == 200 and changed.get_json()["filter"] == {"data.region": "us"}
    untouched = patch(url, json={"description": "kept"}, headers=headers).get_json()
    assert untouched["filter"] == {"data.region": "us"}  # not given: unchanged
    cleared = patch(url, json={"filter": None}, headers=headers)
    assert cleared.status_code == 200 and cleared.get_json()["filter"] is None
    db.session.expire_all()
    assert db.session.get(Subscription, sub["id"]).filter is None
    edits = db.session.scalars(select(AuditEntry).where(AuditEntry.action == "subscription.edited")
                               .order_by(AuditEntry.id)).all()
    assert [e.detail["after"].get("filter", "-") for e in edits] == [{"data.region": "us"}, "-", None]
    assert edits[0].detail["before"]["filter"] == spec and edits[2].detail["before"]["filter"] == {"data.region": "us"}


@sqlite_only
def test_creating_with_a_wrong_filter_stores_nothing(app, producer, receiver):
    resp = producer.post("/api/v1/subscriptions", {"url": receiver.url + "/ok",
                                                   "filter": {"data.amount": {"$between": [1, 2]}}})
    assert resp.status_code == 422
    assert resp.get_json()["error"].startswith("filter.data.amount: unknown operator '$between'")
    assert db.session.scalar(select(Subscription.id)) is None
