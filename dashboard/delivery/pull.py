"""Pull delivery (issue 40): a pull subscription's deliveries wait in the database for its own client.

No worker sends them (WorkQueue.push leaves them out, the sweeper does not enqueue them, a drain that
claims a stray one gives it back unsent). The client leases due ones (`pull`) with the drain's own claim
(delivery.ledger), so two clients never hold the same delivery at once, and answers each with an ack (`ack`), which the
ledger records as the attempt: a 2xx settles it, anything else follows the retry policy as a failed push
does. A lease that runs out unacked is recorded as a failed attempt, "lease expired" (`expire_leases`: at
the subscription's pulls and acks, at most once a second, and by the sweeper for all of them).

Each lease of a delivery is one attempt, so (delivery id, attempt) names the lease an ack answers: the ack
of a lease that ran out, or passed to another client, finds another attempt (or none) and is refused.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from flask import current_app
from sqlalchemy import bindparam, case, func, select, update

from dashboard.core.clock import unix
from dashboard.core.validation import ApiError
from dashboard.delivery import http
from dashboard.delivery.engine import DeliveryEngine
from dashboard.delivery.failures import LEASE_EXPIRED, REPORTED
from dashboard.delivery.ledger import (
    DELIVERIES,
    DUE_STATE,
    SUBSCRIPTIONS,
    DrainStats,
    Finished,
    claim_statement,
    load,
)
from dashboard.delivery.policies import Outcome
from dashboard.models import (
    ConsumerState,
    DeliveryState,
    Subscription,
    SubscriptionMode,
    SubscriptionState,
)
from dashboard.queue.work import WorkQueue

# A subscription's pulls and acks record its leases that ran out at most this often (by the app's clock): the
# look reads every delivery the subscription owes. A lease that ran out meanwhile is refused to its late ack all
# the same, and handed out again by the next look.
EXPIRY_LOOK_SECONDS = 1.0
# A pull takes at most this many rounds: a round whose candidates other clients took looks again.
ROUNDS = 3
# What a pull subscription does not have: it is never POSTed to. Given with pull, a 422 says so.
PUSH_ONLY = {
    "url": "it has no URL: its receiver fetches its deliveries",
    "headers": "no request is sent to its receiver to carry them",
    "auth": "no request is sent to its receiver, so no token is fetched for one",
    "tls": "no connection is made to its receiver, so no client certificate is presented",
    "rate_limit_per_s": "its receiver paces itself by how much it pulls",
    "max_in_flight": "its receiver paces itself by how much it pulls",
    "connect_timeout": "no connection is made to its receiver",
    "attempt_timeout": "its attempt lasts as long as the lease it asks for",
    "check": "the receiver check POSTs to a URL",
}

_PULL_SUBSCRIPTIONS = select(SUBSCRIPTIONS.c.id).where(SUBSCRIPTIONS.c.mode == SubscriptionMode.PULL)
# Candidates, oldest due first (ix_deliveries_owed); the claim below decides who gets each.
_CANDIDATES = (select(DELIVERIES.c.id)
               .where(DELIVERIES.c.subscription_id == bindparam("subscription_id"), DUE_STATE,
                      DELIVERIES.c.next_attempt_at <= bindparam("now"), DELIVERIES.c.lease_token.is_(None))
               .order_by(DELIVERIES.c.next_attempt_at, DELIVERIES.c.id).limit(bindparam("limit")))
# The engine's claim, and never a lease that ran out unrecorded (expire_leases records it first); the pull's
# time is kept in updated_at, for the attempt's time and duration.
_LEASE = claim_statement().where(DELIVERIES.c.lease_token.is_(None)) \
    .values(updated_at=bindparam("now")).returning(DELIVERIES.c.id)
# Leases that ran out unacked, taken over by a fresh token (so only one recorder writes each one's attempt).
_TAKE_EXPIRED = (update(DELIVERIES)
                 .where(DELIVERIES.c.lease_token.is_not(None), DELIVERIES.c.lease_expires_at < bindparam("now"),
                        DUE_STATE)
                 .values(lease_token=bindparam("token"))
                 .returning(DELIVERIES.c.id, DELIVERIES.c.updated_at, DELIVERIES.c.lease_expires_at))
# Acked leases, taken over by a fresh token while still live: an ack recorded twice (or after the lease ran
# out) finds its token gone.
_TAKE_ACKED = (update(DELIVERIES)
               .where(DELIVERIES.c.id.in_(bindparam("ids", expanding=True)),
                      DELIVERIES.c.lease_token == bindparam("held"),
                      DELIVERIES.c.lease_expires_at >= bindparam("now"))
               .values(lease_token=bindparam("token"))
               .returning(DELIVERIES.c.id))
_LEASED = select(DELIVERIES.c.id, DELIVERIES.c.attempt_count, DELIVERIES.c.lease_token, DELIVERIES.c.lease_expires_at,
                 DELIVERIES.c.updated_at, DELIVERIES.c.state) \
    .where(DELIVERIES.c.id.in_(bindparam("ids", expanding=True)),
           DELIVERIES.c.subscription_id == bindparam("subscription_id"))
# When this subscription next has a delivery to hand out: a due one's next attempt, or a lease's end.
_NEXT_DUE = select(func.min(case((DELIVERIES.c.lease_token.is_(None), DELIVERIES.c.next_attempt_at),
                                 else_=DELIVERIES.c.lease_expires_at))) \
    .where(DELIVERIES.c.subscription_id == bindparam("subscription_id"), DUE_STATE)
_AFTER = select(DELIVERIES.c.id, DELIVERIES.c.state, DELIVERIES.c.next_attempt_at) \
    .where(DELIVERIES.c.id.in_(bindparam("ids", expanding=True)))


@dataclass(frozen=True)
class Pulled:
    delivery_id: str
    attempt: int
    body: str
    headers: dict[str, str]


@dataclass(frozen=True)
class Acked:
    """What became of one ack entry: 200 recorded (with the delivery's state after it), 409 or 404 refused."""

    delivery_id: str
    status: int
    state: str | None = None
    next_attempt_at: dt.datetime | None = None
    error: str | None = None


def refuse_push_settings(given: dict) -> None:
    """422 naming the first field (of those given with a value) that a pull subscription cannot have."""
    for name, why in PUSH_ONLY.items():
        if given.get(name) not in (None, {}, False, ""):
            raise ApiError(422, f"{name}: a pull subscription takes no {name} ({why})")


def check_mode(body) -> None:
    """422 unless a new subscription's settings fit its mode: push needs a URL, pull takes none of push's."""
    if body.mode == SubscriptionMode.PULL:
        refuse_push_settings({name: getattr(body, name, None) for name in body.model_fields_set})
    elif body.url is None:
        raise ApiError(422, 'url: a push subscription needs the URL its deliveries are POSTed to (or "mode": "pull" '
                            "for one its receiver fetches)")


def engine_for(app) -> DeliveryEngine:
    """One engine per app for pull and ack: its decisions, its recording and its cache of decrypted secrets."""
    engine = app.extensions.get("promesa_pull_engine")
    if engine is None:
        engine = app.extensions["promesa_pull_engine"] = DeliveryEngine(app, WorkQueue.for_app(app),
                                                                        app.config["CLOCK"])
    return engine


def hands_out(sub: Subscription) -> bool:
    """Whether its pulls hand anything out: not while it or its consumer is paused or disabled."""
    return sub.state == SubscriptionState.ACTIVE and (sub.consumer is None
                                                      or sub.consumer.state == ConsumerState.ACTIVE)


def pull(sub: Subscription, limit: int, lease_seconds: int) -> list[Pulled]:
    """Lease up to `limit` due deliveries of this pull subscription for `lease_seconds`, with the body and
    signature headers a push would carry. Nothing while it or its consumer is paused or disabled."""
    engine = engine_for(current_app._get_current_object())
    now = engine.clock.now()
    if sub.listen_seen_due(now):  # a listen session is alive while it pulls, paused or not
        with engine.db_engine.begin() as conn:
            conn.execute(update(SUBSCRIPTIONS).where(SUBSCRIPTIONS.c.id == sub.id).values(listen_seen_at=now))
    _expire_now_and_then(engine, now, sub.id)
    if not hands_out(sub):
        return []
    token = str(uuid.uuid4())
    params = {"now": now, "token": token, "until": now + dt.timedelta(seconds=lease_seconds)}
    items, order = [], {}  # order: oldest due first, as the candidates were read (the load's is the database's)
    for _ in range(ROUNDS):
        wanted = limit - len(items)
        with engine.db_engine.connect() as conn:  # read before the write transaction: SQLite takes its lock late
            candidates = conn.execute(_CANDIDATES, {"subscription_id": sub.id, "now": now, "limit": wanted}
                                      ).scalars().all()
        if not candidates:
            break
        order.update((delivery_id, len(order) + n) for n, delivery_id in enumerate(candidates))
        with engine.db_engine.begin() as conn:
            leased = conn.execute(_LEASE, params | {"ids": candidates}).scalars().all()
            items += load(conn, leased)
        if len(candidates) < wanted or len(leased) == len(candidates):
            break
    timestamp = int(unix(now))
    return [Pulled(item.delivery_id, item.attempt_number, item.body.decode("utf-8"), http.delivery_headers(
        event_id=item.event_id, event_type=item.event_type, delivery_id=item.delivery_id,
        attempt_number=item.attempt_number, scheme=item.scheme, secrets=engine.signing_secrets(item, now),
        timestamp=timestamp, body=item.body, consumer=item.consumer_uid, traceparent=item.traceparent))
        for item in sorted(items, key=lambda item: order[item.delivery_id])]


def next_due(sub: Subscription) -> dt.datetime | None:
    """When a pull of this subscription next finds something without a new event: its earliest scheduled
    retry, or the end of the earliest lease another client holds (None: nothing is owed)."""
    engine = engine_for(current_app._get_current_object())
    with engine.db_engine.connect() as conn:
        return conn.execute(_NEXT_DUE, {"subscription_id": sub.id}).scalar()


def ack(sub: Subscription, entries) -> list[Acked]:
    """Record each entry as the attempt of the lease it answers; refuse (409) one whose lease ran out or
    passed to another client, and one named twice; 404 for a delivery that is not this subscription's."""
    engine = engine_for(current_app._get_current_object())
    now = engine.clock.now()
    _expire_now_and_then(engine, now, sub.id)
    ids = list(dict.fromkeys(entry.delivery_id for entry in entries))
    with engine.db_engine.connect() as conn:
        leased = {row.id: row for row in conn.execute(_LEASED, {"ids": ids, "subscription_id": sub.id})}
    results: dict[int, Acked] = {}
    answering: dict[str, tuple[int, object]] = {}  # delivery id -> (entry index, entry), leases still live
    for index, entry in enumerate(entries):
        row = leased.get(entry.delivery_id)
        refusal = _refusal(row, entry, now) if entry.delivery_id not in answering else \
            "named twice in this ack: the first entry is the answer"
        if row is None:
            results[index] = Acked(entry.delivery_id, 404, error=f"no delivery {entry.delivery_id!r} of this "
                                                                 "subscription")
        elif refusal:
            results[index] = Acked(entry.delivery_id, 409, error=refusal)
        else:
            answering[entry.delivery_id] = (index, entry)
    token = str(uuid.uuid4())
    taken = []
    if answering:
        by_lease: dict[str, list[str]] = {}
        for delivery_id in answering:
            by_lease.setdefault(leased[delivery_id].lease_token, []).append(delivery_id)
        with engine.db_engine.begin() as conn:
            for held, lease_ids in by_lease.items():
                taken += conn.execute(_TAKE_ACKED, {"ids": lease_ids, "held": held, "now": now, "token": token}
                                      ).scalars().all()
            items = load(conn, taken)
        finished = []
        for item in items:
            _, entry = answering[item.delivery_id]
            pulled_at = leased[item.delivery_id].updated_at
            finished.append(Finished(item, token, pulled_at, _result(entry, pulled_at, now)))
        engine.ledger.record(finished, DrainStats())
    after = {}
    if taken:
        with engine.db_engine.connect() as conn:
            after = {row.id: row for row in conn.execute(_AFTER, {"ids": taken})}
    for delivery_id, (index, _) in answering.items():
        row = after.get(delivery_id)
        results[index] = Acked(delivery_id, 200, row.state, row.next_attempt_at
                               if row.state == DeliveryState.SCHEDULED else None) if row is not None else \
            Acked(delivery_id, 409, error="its lease ran out or passed to another client while this ack was read")
    return [results[index] for index in range(len(entries))]


def _refusal(row, entry, now: dt.datetime) -> str | None:
    """Why this entry cannot be the answer of its delivery's lease (None: it can)."""
    if row is None:
        return None
    if row.lease_token is None or row.attempt_count + 1 != entry.attempt:
        return (f"attempt {entry.attempt} is not leased to anyone now: its lease ran out (recorded as a failed "
                f"attempt) or passed to another client; the delivery has had {row.attempt_count} attempts")
    if row.lease_expires_at < now:
        return f"the lease of attempt {entry.attempt} ran out before this ack"
    return None


def _result(entry, pulled_at: dt.datetime, now: dt.datetime) -> http.AttemptResult:
    """An ack entry as an attempt: its status, or (null) the error it gives; its duration since the pull."""
    error = entry.error or None
    if entry.status is None:
        outcome = Outcome(error=f"{REPORTED}: {error}" if error else f"{REPORTED}: no status")
        excerpt = None
    else:
        outcome, excerpt = Outcome(status_code=entry.status), error
    return http.AttemptResult(outcome, _milliseconds(now - pulled_at), excerpt)


def _milliseconds(span: dt.timedelta) -> int:
    return max(0, int(span.total_seconds() * 1000))


def _expire_now_and_then(engine: DeliveryEngine, now: dt.datetime, subscription_id: str) -> None:
    looked = engine.app.extensions.setdefault("promesa_pull_expiry_looks", {})  # subscription id -> last look
    last = looked.get(subscription_id)
    if last is not None and last <= now < last + dt.timedelta(seconds=EXPIRY_LOOK_SECONDS):
        return
    looked[subscription_id] = now
    expire_leases(engine, now, subscription_id)


def expire_leases(engine: DeliveryEngine, now: dt.datetime, subscription_id: str | None = None) -> int:
    """Record every pull lease that ran out unacked (of one subscription, or of all) as a failed attempt,
    "lease expired", decided by the retry policy as a failed push is. Returns how many."""
    where = DELIVERIES.c.subscription_id == subscription_id if subscription_id is not None else \
        DELIVERIES.c.subscription_id.in_(_PULL_SUBSCRIPTIONS.scalar_subquery())
    token = str(uuid.uuid4())
    with engine.db_engine.begin() as conn:
        rows = conn.execute(_TAKE_EXPIRED.where(where), {"now": now, "token": token}).all()
        items = load(conn, [row.id for row in rows])
    if not items:
        return 0
    leases = {row.id: row for row in rows}
    engine.ledger.record([Finished(item, token, leases[item.delivery_id].updated_at, http.AttemptResult(
        Outcome(error=LEASE_EXPIRED),
        _milliseconds(leases[item.delivery_id].lease_expires_at - leases[item.delivery_id].updated_at), None))
        for item in items], DrainStats())
    return len(items)

