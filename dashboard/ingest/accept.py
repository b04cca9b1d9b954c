"""Accepting events: validate, store the event and one delivery per matching subscription
in one transaction, and only then hand the delivery ids to the work queue."""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
import logging
from dataclasses import dataclass
from typing import NamedTuple

from flask import current_app
from sqlalchemy import (
    DateTime,
    Text,
    and_,
    any_,
    bindparam,
    cast,
    func,
    literal_column,
    null,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY, array
from sqlalchemy.exc import IntegrityError

from dashboard.core import filters
from dashboard.core.clock import iso
from dashboard.core.extensions import db
from dashboard.core.ids import new_ids
from dashboard.core.validation import (
    MAX_DATA_DEPTH,
    ApiError,
    compact_json,
    expired_token,
    invalid_token,
    nesting_depth,
    parse_time,
    refuse_nul,
)
from dashboard.ingest import autocommit, catalog, quotas
from dashboard.ingest.writing import Promised, delivery_rows, new_delivery_values, store_once, thin_body
from dashboard.ingest.routing_cache import GENERATION, Lookup, ReadAgain
from dashboard.models import (
    ApiToken,
    Consumer,
    ConsumerState,
    Event,
    EventType,
    Subscription,
    SubscriptionState,
    Team,
)
from dashboard.queue import handoff
from dashboard.schemas import EventInput

log = logging.getLogger(__name__)


def validate_event(event: EventInput, cap: int) -> str:
    """What the schema cannot say about an event's data: no NaN, Infinity or NUL, at most `cap` bytes and
    MAX_DATA_DEPTH levels. Returns data as compact JSON (sized here, reused in the body)."""
    data_json = compact_json(event.data, "data")
    if "\\u0000" in data_json:  # how json.dumps writes NUL: only then is the data walked for where it is
        refuse_nul(event.data, "data")
    size = len(data_json.encode("utf-8"))
    if size > cap:
        raise ApiError(413, f"data is {size} bytes; the cap is {cap} bytes (send ids and versions, not content)")
    # Each level takes at least two characters: short data cannot be too deep, and is not walked.
    if len(data_json) > 2 * MAX_DATA_DEPTH and (depth := nesting_depth(event.data)) > MAX_DATA_DEPTH:
        raise ApiError(422, f"data is nested {depth} levels deep; at most {MAX_DATA_DEPTH} (thin events carry "
                            "ids and versions)")
    return data_json


def wants(sub, event_type: str, version: int) -> bool:
    """Does the subscription (or its routing row: event_types, event_versions) take this type at this version?"""
    pinned = (sub.event_versions or {}).get(event_type)
    return (pinned is None or pinned == version) and any(fnmatch.fnmatchcase(event_type, p) for p in sub.event_types)


class Route(NamedTuple):
    """A subscription as routing reads it (a routing row), with its payload filter compiled (None: no filter).
    Made when the rows are read, so a kept answer (routing_cache) carries its filters compiled."""
    id: str
    state: str
    event_types: list
    event_versions: dict | None
    consumer_id: int | None
    admits: filters.Predicate | None
    mode: str  # push or pull: a pull subscription's deliveries are not work for the push workers


def routes(rows) -> list[Route]:
    """Routing rows (those naming a subscription) as Routes."""
    return [Route(row.id, row.state, row.event_types, row.event_versions, row.consumer_id,
                  filters.stored(row.filter_json), row.mode) for row in rows if row.id is not None]


def resource_id_of(data: dict) -> str | None:
    """data.resource_id as the searchable events.resource_id: a string or number of at most 200 characters."""
    value = data.get("resource_id")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    value = str(value)
    return value if len(value) <= 200 else None


# Built once (ingest runs them on every request): what routing needs of each subscription (its payload filter as
# JSON text, the key its compiled predicate is kept by: filters.compiled_json), and the event a repeated
# Idempotency-Key names.
_ROUTING = select(Subscription.id, Subscription.state, Subscription.event_types, Subscription.event_versions,
                  Subscription.consumer_id, cast(Subscription.filter, Text).label("filter_json"), Subscription.mode) \
    .where(Subscription.team_id == bindparam("team_id"), Subscription.deleted_at.is_(None))
# On PostgreSQL only (migrations f2c6a8d1e4b7, c5d9e3a7b1f4): a stored column the model does not map, so SQLite
# has none.
_ROUTE_KEYS = literal_column("subscriptions.route_keys", ARRAY(Text))


# For one event type: only the subscriptions that can want it, i.e. that name it exactly or have a pattern
# (a '*', '?' or '[' inside a string of their JSON list); `wants` still decides. A team with a thousand
# subscriptions, each for its own type, sent all of them to Python on every request.
def _may_want_the_type(team_id, indexed: bool, consumer_id=None):
    """On PostgreSQL (`indexed`), through ix_subscriptions_route_keys: a subscription's keys are "<team> <type>",
    or "<team> *" for a pattern, with ".<consumer>" after the team for a consumer's (migrations e8c4a1f7b2d9,
    f2c6a8d1e4b7, c5d9e3a7b1f4), so only the subscriptions of the team (or of the consumer `consumer_id`) that
    may want the type are read, not every one of the team's. The keys are stored, computed when a subscription
    is written. Elsewhere, LIKE on the JSON lists of the team's (or the consumer's) subscriptions."""
    if indexed:
        owner = cast(team_id, Text) + ("" if consumer_id is None else "." + cast(consumer_id, Text)) + " "
        return and_(_ROUTE_KEYS.op("&&")(array([owner + bindparam("name", type_=Text), owner + "*"])),
                    Subscription.deleted_at.is_(None))  # the index's own condition
    return and_(Subscription.team_id == team_id,
                Subscription.consumer_id.is_(None) if consumer_id is None else Subscription.consumer_id == consumer_id,
                Subscription.deleted_at.is_(None), or_(
                    cast(Subscription.event_types, Text).like(bindparam("type_pattern"), escape="/"),
                    *(cast(Subscription.event_types, Text).like(pattern) for pattern in ('%*%', '%?%', '%"%[%'))))


def _indexed_routing() -> bool:
    return db.engine.dialect.name == "postgresql"


class BearerToken(NamedTuple):
    """A producer's token (its digest) not looked up yet: the routing statement finds its team."""
    digest: str


class Caller(NamedTuple):
    """The producing team, as ingest needs it (and, read by token, when the token expires), and the consumer an
    addressed event names: its id (None: no live consumer has the uid) and whether it holds its deliveries."""
    id: int
    strict_event_types: bool
    token_expires_at: dt.datetime | None = None
    consumer_id: int | None = None
    consumer_holds: bool = False


# Whose routing: a team, or the team a live token names (no row then means no such token).
# The expiry is read, not filtered on: what is kept must still refuse a token once it has expired.
_CALLER_BY_TEAM = select(Team.id.label("team_id"), Team.strict_event_types.label("strict"),
                         cast(null(), DateTime).label("expires_at")) \
    .where(Team.id == bindparam("team_id")).subquery("caller")
_CALLER_BY_TOKEN = select(ApiToken.team_id.label("team_id"), Team.strict_event_types.label("strict"),
                          ApiToken.expires_at.label("expires_at")) \
    .join(Team, Team.id == ApiToken.team_id) \
    .where(ApiToken.token_sha256 == bindparam("digest"), ApiToken.revoked_at.is_(None)).subquery("caller")


def _routed_and_declared(caller, exact: bool, indexed: bool, addressed: bool):
    """The caller, the routing of one type and its declaration in the catalog (`exact`: of the asked version,
    else the latest) as one statement: one row per subscription that may want the type, each carrying the
    caller and the declaration (or NULLs), or a single row when none may; no row when there is no caller.
    Outer joins from the caller's one row, so that either side may be missing. `addressed`: the subscriptions
    are those of the team's live consumer with the uid "consumer" (its id and state on every row: NULL when
    there is none), else the team's own."""
    declared = EventType.__table__.alias("declared")
    version = bindparam("version") if exact else select(func.max(EventType.version)).where(
        EventType.team_id == caller.c.team_id, EventType.name == bindparam("name")).scalar_subquery()
    joined = caller.outerjoin(declared, and_(declared.c.team_id == caller.c.team_id,
                                             declared.c.name == bindparam("name"), declared.c.version == version))
    addressee = []
    if addressed:
        consumer = Consumer.__table__.alias("addressee")
        joined = joined.outerjoin(consumer, and_(consumer.c.team_id == caller.c.team_id,
                                                 consumer.c.uid == bindparam("consumer"),
                                                 consumer.c.deleted_at.is_(None)))
        addressee = [consumer.c.id.label("addressee_id"), consumer.c.state.label("addressee_state")]
    return select(caller.c.team_id, caller.c.strict, caller.c.expires_at.label("token_expires_at"),
                  declared.c.id.label("declared_id"), declared.c.name.label("declared_name"),
                  declared.c.version.label("declared_version"), declared.c.schema.label("declared_schema"),
                  *addressee, *_ROUTING.selected_columns, *([GENERATION] if indexed else [])).select_from(
        joined.outerjoin(Subscription, _may_want_the_type(caller.c.team_id, indexed,
                                                          addressee[0] if addressed else None)))


# (read by token, version asked, on PostgreSQL, addressed) -> the statement
_ROUTED_AND_DECLARED = {(by_token, exact, indexed, addressed): _routed_and_declared(
    _CALLER_BY_TOKEN if by_token else _CALLER_BY_TEAM, exact, indexed, addressed)
    for by_token in (False, True) for exact in (False, True) for indexed in (False, True)
    for addressed in (False, True)}
# (on PostgreSQL) -> the team's own subscriptions that may want one type
_ROUTING_ONE_TYPE = {indexed: select(*_ROUTING.selected_columns).where(
    _may_want_the_type(bindparam("team_id"), indexed)) for indexed in (False, True)}


def _among(column, name: str, array: bool):
    """`column` is one of the list parameter `name`: on PostgreSQL one array parameter (ingest's own connection
    sends statements compiled once, and expanding parameters are compiled per execution), else IN (...)."""
    if array:
        return column == any_(bindparam(name, type_=ARRAY(column.type)))
    return column.in_(bindparam(name, expanding=True))


# (on PostgreSQL) -> the team's live consumers among some uids, each with its live subscriptions (one row per
# subscription, or a single row of NULLs for a consumer with none)
_CONSUMERS_ROUTING = {array: select(Consumer.uid.label("addressee_uid"), Consumer.id.label("addressee_id"),
                                    Consumer.state.label("addressee_state"), *_ROUTING.selected_columns)
                      .select_from(Consumer.__table__.outerjoin(Subscription.__table__, and_(
                          Subscription.team_id == Consumer.team_id, Subscription.consumer_id == Consumer.id,
                          Subscription.deleted_at.is_(None))))
                      .where(Consumer.team_id == bindparam("team_id"), _among(Consumer.uid, "uids", array),
                             Consumer.deleted_at.is_(None))
                      for array in (False, True)}
_TEAMS_OWN_ROUTING = _ROUTING.where(Subscription.consumer_id.is_(None))


class Declared(NamedTuple):
    """An event type's declaration as catalog.resolve reads it."""
    id: int
    name: str
    version: int
    schema: dict


def _type_pattern(event_type: str) -> str:
    quoted = json.dumps(event_type)  # as the JSON list spells it
    return "%" + quoted.replace("/", "//").replace("%", "/%").replace("_", "/_") + "%"


def _one_type_params(event_type: str, indexed: bool) -> dict:
    """What _may_want_the_type asks for: the type's name for the route keys, or its LIKE pattern."""
    return {"name": event_type} if indexed else {"name": event_type, "type_pattern": _type_pattern(event_type)}


def unknown_consumer(uid: str) -> ApiError:
    return ApiError(422, f"consumer: your team has no consumer {uid!r} (create it with PUT /api/v1/consumers/{uid}); "
                         "nothing was stored")


def _routing(team_id: int, event_types: set[str], uids: set[str | None]) -> tuple[list, dict]:
    """What routing needs of each subscription that may want one of these event types: the team's own (when
    None is among `uids`) and those of the consumers named, never another consumer's; and uid -> (id, holds its
    deliveries) of the team's live consumers among `uids`. One read per kind of owner."""
    rows, consumers = [], {}
    if None in uids:
        if len(event_types) == 1:
            indexed = _indexed_routing()
            rows = autocommit.read(_ROUTING_ONE_TYPE[indexed],
                                   {"team_id": team_id} | _one_type_params(next(iter(event_types)), indexed))
        else:
            rows = autocommit.read(_TEAMS_OWN_ROUTING, {"team_id": team_id})
    if uids - {None}:
        addressed = autocommit.read(_CONSUMERS_ROUTING[_indexed_routing()],
                                    {"team_id": team_id, "uids": sorted(uids - {None})})
        consumers = {row.addressee_uid: (row.addressee_id, row.addressee_state == ConsumerState.DISABLED)
                     for row in addressed}
        rows = [*rows, *addressed]
    return routes(rows), consumers


def _routing_and_declaration(producer: Team | BearerToken, event_type: str, version: int | None,
                             consumer: str | None, lookup: Lookup) -> tuple[list, Declared | None, Caller]:
    """_routing for one event type (and one consumer, or none), the declaration catalog.resolve would read for
    it (the asked version's, or the latest) and the producing team, in one round trip instead of three: a
    request usually carries one event, of one type. 401 when `producer` is a token that names no team (unknown
    or revoked); 422 when `consumer` names none of its live consumers. On PostgreSQL the answer is kept, and a
    later request may take it from `lookup` (see routing_cache)."""
    by_token, indexed = isinstance(producer, BearerToken), _indexed_routing()
    key = (producer if by_token else producer.id, event_type, version, consumer)
    kept = lookup.kept(key)
    if kept is not None:
        return _unexpired(kept, consumer)
    params = _one_type_params(event_type, indexed) \
        | ({"digest": producer.digest} if by_token else {"team_id": producer.id}) \
        | ({} if version is None else {"version": version}) | ({} if consumer is None else {"consumer": consumer})
    # Core, not the ORM session: this runs on every request, and returns plain rows anyway.
    rows = autocommit.read(_ROUTED_AND_DECLARED[by_token, version is not None, indexed, consumer is not None], params)
    if not rows:
        raise invalid_token()
    first = rows[0]
    declared = None if first.declared_version is None else \
        Declared(first.declared_id, first.declared_name, first.declared_version, first.declared_schema)
    caller = Caller(first.team_id, first.strict, first.token_expires_at) if consumer is None else \
        Caller(first.team_id, first.strict, first.token_expires_at, first.addressee_id,
               first.addressee_state == ConsumerState.DISABLED)
    answer = routes(rows), declared, caller
    lookup.keep(key, answer, first.routing_generation if indexed else None)
    return _unexpired(answer, consumer)


def _unexpired(answer: tuple, consumer: str | None) -> tuple:
    """401 for a token past its expiry (checked on every request: expiring moves no routing generation);
    422 for a uid that names no live consumer (a refusal kept is read again before it is given: ingest_many)."""
    caller = answer[2]
    if caller.token_expires_at is not None and caller.token_expires_at <= current_app.config["CLOCK"].now():
        raise expired_token(caller.token_expires_at)
    if consumer is not None and caller.consumer_id is None:
        raise unknown_consumer(consumer)
    return answer


_EVENTS_BY_ID = select(Event).where(Event.team_id == bindparam("team_id"),
                                    Event.id.in_(bindparam("ids", expanding=True)))
_EVENT_BY_ID = select(Event).where(Event.team_id == bindparam("team_id"), Event.id == bindparam("id"))
_BY_IDEMPOTENCY_KEY = select(Event).where(Event.team_id == bindparam("team_id"),
                                          Event.idempotency_key == bindparam("key"))


def _stored_events(team: Team, event_ids: list[str]) -> dict[str, Event]:
    """The team's already stored events among these ids, in one query rather than one per event."""
    if not event_ids:
        return {}
    return {e.id: e for e in db.session.scalars(_EVENTS_BY_ID, {"team_id": team.id, "ids": list(set(event_ids))})}


def _existing(team: Team, event_id: str | None, idempotency_key: str | None,
              stored: dict[str, Event] | None = None) -> Event | None:
    """The event a key or id already names. `stored`: the batch's ids already looked up (_stored_events)."""
    if idempotency_key:
        found = db.session.scalar(_BY_IDEMPOTENCY_KEY, {"team_id": team.id, "key": idempotency_key})
        if found:
            return found
    if event_id:
        return stored.get(event_id) if stored is not None else team_event(team, event_id)
    return None


def team_event(team: Team, event_id: str) -> Event | None:
    """The team's event with this id. Ids are unique per team: another team's event with the same id is
    another event, and never found from here."""
    return db.session.scalar(_EVENT_BY_ID, {"team_id": team.id, "id": event_id})


@dataclass(frozen=True)
class Accepted:
    id: str
    deliveries: int
    duplicate: bool


def ingest(producer: Team | BearerToken, event: EventInput, idempotency_key: str | None = None,
           traceparent: str | None = None) -> Accepted:
    """Store one event and its deliveries (or find the first one, for a repeated key or id). `producer`: the
    team, or the request's token, which the routing statement then checks (401 if it names no team)."""
    if idempotency_key is not None and (not 0 < len(idempotency_key) <= 255 or "\x00" in idempotency_key):
        raise ApiError(400, "Idempotency-Key must be 1 to 255 characters, without NUL characters")
    return ingest_many(producer, [event], idempotency_key, numbered=False, traceparent=traceparent)[0]


def ingest_many(team: Team | BearerToken, events_in: list[EventInput], idempotency_key: str | None = None,
                numbered: bool = True, only: tuple[str, bool] | None = None,
                traceparent: str | None = None) -> list[Accepted]:
    """Validate every event first, then store them all and their deliveries in one transaction,
    then enqueue. One bad event rejects the whole batch: nothing is stored half-way.
    `only`: (subscription id, active): deliver to that one subscription alone, whatever its filters
    and the catalog say (a test event). A BearerToken for `team` only with events of one type and version.
    `traceparent`: the request's (valid: dashboard.core.tracing.traceparent), stored with every event of it."""
    lookup = Lookup(autocommit.routing_cache() if autocommit.in_autocommit() else None)
    admitted: list[bool] = []  # the quota is taken once, even when the request is read again
    try:
        return _ingest_many(team, events_in, idempotency_key, numbered, only, lookup, admitted, traceparent)
    except ReadAgain as again:
        if again.changed:
            lookup.stale()
    except quotas.QuotaExceeded:
        raise  # refused on the team alone: a fresh read of the routing would not change it
    except ApiError:
        if lookup.generation is None or lookup.writing:
            raise
    # The routing kept had changed, or refused the request: answer from a fresh read instead.
    return _ingest_many(team, events_in, idempotency_key, numbered, only, Lookup(None), admitted, traceparent)


def _ingest_many(team: Team | BearerToken, events_in: list[EventInput], idempotency_key: str | None,
                 numbered: bool, only: tuple[str, bool] | None, lookup: Lookup, admitted: list[bool],
                 traceparent: str | None) -> list[Accepted]:
    def at(index: int, exc: ApiError) -> ApiError:
        """In a batch, an error names the event it is about."""
        return ApiError(exc.status, f"events[{index}]: {exc.message}") if numbered else exc

    cap = current_app.config["PROMESA_MAX_DATA_BYTES"]
    checked = []
    for index, event in enumerate(events_in):
        try:
            checked.append((event.type, event.data, event.id, event.version, validate_event(event, cap),
                            parse_time(event.timestamp, "timestamp"), event.consumer))
        except ApiError as exc:
            raise at(index, exc) from None

    now = current_app.config["CLOCK"].now()
    now_iso = iso(now)
    event_types = {c[0] for c in checked}
    uids = {c[6] for c in checked}
    declarations: dict[tuple, Declared | None] = {}  # (type, asked version) -> read with the routing
    # uid (None: unaddressed) -> (consumer id, holds its deliveries)
    addressees: dict[str | None, tuple[int | None, bool]] = {None: (None, False)}
    if only is not None:
        subscriptions = []
    elif len(event_types) == 1 and len(asked := {c[3] for c in checked}) == 1 and len(uids) == 1:
        key = (next(iter(event_types)), next(iter(asked)))
        uid = next(iter(uids))
        subscriptions, declarations[key], team = _routing_and_declaration(team, *key, uid, lookup)
        addressees[uid] = team.consumer_id, team.consumer_holds
    else:
        subscriptions, found = _routing(team.id, event_types, uids)
        for index, c in enumerate(checked):
            if c[6] is not None and c[6] not in found:
                raise at(index, unknown_consumer(c[6]))
        addressees.update(found)
    owned: dict[int | None, list] = {}  # consumer id (None: the team's own) -> its subscriptions
    for sub in subscriptions:
        owned.setdefault(sub.consumer_id, []).append(sub)
    stored = _stored_events(team, [c[2] for c in checked if c[2]])
    # (type, asked version, uid) -> (version, declaration, [(subscription id, active)] that want it): once per batch
    plans: dict[tuple, tuple] = {}
    resolutions: dict[tuple, tuple] = {}  # (type, asked version) -> (published version, declaration)
    results: list[Accepted | None] = []
    seen: dict[str, int] = {}  # an id repeated inside the batch is a duplicate of its first appearance
    # Every new event gets a key (unique across teams); one the producer did not name takes it as its id too.
    fresh_keys = iter(new_ids("evt", len(checked)))
    budget = catalog.Budget()  # what validating this request's events may cost, together
    events, promised = [], []  # one Promised per delivery
    for index, (event_type, data, event_id, version, data_json, occurred_at, uid) in enumerate(checked):
        if event_id in seen:
            results.append(None)
            continue
        existing = _existing(team, event_id, idempotency_key, stored)
        if existing is not None:
            results.append(Accepted(existing.id, len(existing.deliveries), True))
            continue
        consumer_id, holds = addressees[uid]
        plan = plans.get((event_type, version, uid))
        if plan is None and only is not None:
            plan = plans[(event_type, version, uid)] = (version or 1, None, [only], [])
        if plan is None:
            resolved = resolutions.get((event_type, version))
            if resolved is None:  # once per type and version, whatever the number of consumers addressed
                if (event_type, version) in declarations:
                    resolved = catalog.published(team, event_type, version, declarations[(event_type, version)])
                else:
                    resolved = catalog.resolve(team, event_type, version)
                resolutions[(event_type, version)] = resolved
            published, declared = resolved
            # A consumer's event reaches its subscriptions alone; an unaddressed one the team's own. Of those
            # that want the type, the ones with a payload filter are asked per event (`filtered`).
            wanting = [sub for sub in owned.get(consumer_id, ()) if wants(sub, event_type, published)]
            targets = [(sub.id, sub.state == SubscriptionState.ACTIVE and not holds)
                       for sub in wanting if sub.admits is None]
            filtered = [(sub.id, sub.state == SubscriptionState.ACTIVE and not holds, sub.admits)
                        for sub in wanting if sub.admits is not None]
            plan = plans[(event_type, version, uid)] = (published, declared, targets, filtered)
        version, declared, targets, filtered = plan
        if declared is not None:
            try:
                catalog.validate_data(declared, data, budget)
            except ApiError as exc:
                raise at(index, exc) from None
        key = next(fresh_keys)
        event_id = event_id or key
        seen[event_id] = index
        timestamp = now_iso if occurred_at is None else iso(occurred_at)
        if filtered:  # the thin body's members, as the filters read them
            body = {"id": event_id, "type": event_type, "version": version, "timestamp": timestamp, "data": data}
            targets = [*targets, *((sub_id, active) for sub_id, active, admits in filtered if admits(body))]
        events.append({"key": key, "id": event_id, "type": event_type, "version": version, "data": data,
                       "resource_id": resource_id_of(data), "consumer_id": consumer_id,
                       "body": thin_body(event_id, event_type, version, timestamp, data_json),
                       "occurred_at": occurred_at or now})
        promised.extend(Promised(key, subscription_id, active) for subscription_id, active in targets)
        results.append(Accepted(event_id, len(targets), False))
    deliveries, ready = delivery_rows(promised)
    if not events and lookup.generation is not None:
        raise ReadAgain(changed=False)  # duplicates only: no write checks the kept routing (a revoked token)
    if events and only is None and not admitted:
        # A test event (`only`) has its own quota (subscriptions.service.send_test_event).
        quotas.admit(team.id, len(events), len(deliveries))
        admitted.append(True)
    if events:
        lookup.writing = True
        try:
            # A traceparent is a column of the write only when given: without one, the write is as it was.
            store_once(events, {"team_id": team.id, "idempotency_key": idempotency_key, "created_at": now,
                                **({} if traceparent is None else {"traceparent": traceparent})},
                       deliveries, new_delivery_values(now), lookup.generation)
        except IntegrityError:
            db.session.rollback()
            if numbered:
                raise ApiError(409, "another request stored one of these event ids at the same moment; "
                                    "send the batch again (ids already stored come back as duplicates)") from None
            # Two requests with the same key or id raced: the first one won, answer with it.
            existing = _existing(team, checked[0][2], idempotency_key)
            if existing is None:
                raise
            return [Accepted(existing.id, len(existing.deliveries), True)]
    handoff.enqueue(ready, team_id=team.id, modes={sub.id: sub.mode for sub in subscriptions})
    for i, result in enumerate(results):
        if result is None:  # repeated inside the batch: the first one's answer, marked as a duplicate
            first = results[seen[checked[i][2]]]
            results[i] = Accepted(first.id, first.deliveries, True)
    return results
