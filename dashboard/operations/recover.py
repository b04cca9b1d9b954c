""""Replay since" (Svix's "recover"): a consumer's events since a time, to one of its endpoints.

What one matches (`RecoverFilter`) and the chunks its job works through (`chunks`); the job itself, its row and
its progress are a bulk replay's (dashboard.operations.replays, kind "recover"). An event of the consumer with no
delivery to the endpoint (it registered late, or the event came with none) gets one; a dead one is sent again; one
delivered or on its way is left alone. Only the event types the endpoint takes, and of an event it never had only
one its payload filter admits, as ingest would have routed them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json

from flask import current_app
from sqlalchemy import func, or_, select, tuple_

from dashboard.core import filters
from dashboard.core.extensions import db
from dashboard.core.validation import parse_time
from dashboard.ingest.accept import wants
from dashboard.ingest.writing import Promised, delivery_rows, insert_rows, new_delivery_values
from dashboard.models import (
    Consumer,
    ConsumerState,
    Delivery,
    DeliveryState,
    Event,
    Replay,
    Subscription,
    SubscriptionState,
)
from dashboard.queue.handoff import enqueue_after_commit
from dashboard.subscriptions import service as subscription_service


def iso_to_the_microsecond(when: dt.datetime) -> str:
    """As stored in the filter: the job must read back the very time it was asked for, not its millisecond."""
    return when.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


@dataclasses.dataclass(frozen=True)
class RecoverFilter:
    """The consumer's events accepted at or after `since`, to one of its subscriptions."""

    consumer_id: int
    consumer: str  # its uid, as pages and the API name it
    subscription_id: str
    team_id: int
    since: dt.datetime

    @classmethod
    def from_json(cls, data: dict) -> RecoverFilter:
        return cls(consumer_id=data["consumer_id"], consumer=data["consumer"], subscription_id=data["subscription_id"],
                   team_id=data["team_id"], since=parse_time(data["since"], "since"))

    def as_json(self) -> dict:
        return {"consumer": self.consumer, "consumer_id": self.consumer_id, "subscription_id": self.subscription_id,
                "team_id": self.team_id, "since": iso_to_the_microsecond(self.since)}

    def key(self) -> str:
        return hashlib.sha256(("recover:" + json.dumps(self.as_json(), sort_keys=True)).encode()).hexdigest()

    def owed(self, until: dt.datetime, replay_id: str | None = None) -> list:
        """WHERE clauses on Event: the consumer's events in [since, until] that have no delivery to the
        subscription, or one dead by `until` (not one this replay already sent again)."""
        to_it = select(Delivery.id).where(Delivery.event_key == Event.key,
                                          Delivery.subscription_id == self.subscription_id)
        dead = to_it.where(Delivery.state == DeliveryState.DEAD, Delivery.dead_lettered_at <= until)
        if replay_id is not None:
            dead = dead.where(or_(Delivery.replay_id.is_(None), Delivery.replay_id != replay_id))
        return [Event.consumer_id == self.consumer_id, Event.created_at >= self.since, Event.created_at <= until,
                or_(~to_it.exists(), dead.exists())]

    def count(self, sub: Subscription, until: dt.datetime) -> int:
        """How many events it would send now: counted per (type, version), each checked against the
        subscription's types; with a payload filter, an event with no delivery yet counts only if it passes."""
        admits = filters.stored(_filter_json(sub))
        if admits is None:
            return sum(n for event_type, version, n in db.session.execute(
                select(Event.type, Event.version, func.count()).where(*self.owed(until))
                .group_by(Event.type, Event.version)).all() if wants(sub, event_type, version))
        had_one = select(Delivery.id).where(Delivery.event_key == Event.key,
                                            Delivery.subscription_id == self.subscription_id).exists()
        rows = db.session.execute(select(Event.type, Event.version, Event.body, had_one.label("dead"))
                                  .where(*self.owed(until)).execution_options(yield_per=1000))
        return sum(1 for row in rows if wants(sub, row.type, row.version)
                   and (row.dead or admits(json.loads(row.body))))


def chunks(replay: Replay, chunk: int):
    """The recover's chunks, oldest events first: (restarted, how many sent), each left uncommitted for the job
    to count and commit. Stops early when the subscription is deleted meanwhile."""
    recover = RecoverFilter.from_json(replay.filter)
    after = None  # (created_at, key) of the last event looked at: the ones the endpoint does not take are passed
    while True:
        sub = db.session.get(Subscription, recover.subscription_id, populate_existing=True)
        if sub.deleted_at is not None:
            return
        admits = filters.stored(_filter_json(sub))
        query = select(Event.key, Event.type, Event.version, Event.created_at,
                       *([Event.body] if admits is not None else [])) \
            .where(*recover.owed(replay.created_at, replay.id))
        if after is not None:
            query = query.where(tuple_(Event.created_at, Event.key) > tuple_(*after))
        rows = db.session.execute(query.order_by(Event.created_at, Event.key).limit(chunk)).all()
        if not rows:
            return
        after = (rows[-1].created_at, rows[-1].key)
        wanted = [row.key for row in rows if wants(sub, row.type, row.version)]
        restarted = subscription_service.restart(
            Delivery.event_key.in_(wanted), Delivery.subscription_id == sub.id,
            Delivery.state == DeliveryState.DEAD, replay_id=replay.id) if wanted else []
        # A dead delivery goes again whatever the filter says now (a replay); an event that never had one gets
        # one only if the filter admits it, as ingest would have routed it.
        if admits is None:
            admitted = wanted
        else:
            taken = set(wanted)
            admitted = [row.key for row in rows if row.key in taken and admits(json.loads(row.body))]
        made = _deliveries_for(sub, admitted, replay.id)
        yield restarted + made, len(restarted) + len(made)


def _filter_json(sub: Subscription) -> str | None:
    """The subscription's payload filter as the JSON text its compiled predicate is kept by (None: no filter)."""
    return None if sub.filter is None else json.dumps(sub.filter, separators=(",", ":"))


def _deliveries_for(sub: Subscription, event_keys: list[str], replay_id: str) -> list[tuple[str, str, str]]:
    """A delivery to `sub` for each of these events that has none: pending (to the workers when the job commits),
    or held while the subscription or its consumer is not active. Its retry schedule starts now, not when the
    event was accepted."""
    if not event_keys:
        return []
    have = set(db.session.scalars(select(Delivery.event_key).where(Delivery.event_key.in_(event_keys),
                                                                   Delivery.subscription_id == sub.id)))
    missing = [key for key in event_keys if key not in have]
    if not missing:
        return []
    consumer = db.session.get(Consumer, sub.consumer_id, populate_existing=True)
    active = sub.state == SubscriptionState.ACTIVE and consumer.state == ConsumerState.ACTIVE
    now = current_app.config["CLOCK"].now()
    rows, ready = delivery_rows([Promised(key, sub.id, active) for key in missing])
    insert_rows(Delivery.__table__, rows, same=new_delivery_values(now) | {"schedule_started_at": now,
                                                                           "replay_id": replay_id})
    enqueue_after_commit(ready)
    return [(sub.id, row["id"], row["state"]) for row in rows]
