"""Quotas: what one team may take of Promesa, so that it cannot slow or fill it for the others.

| quota                   | default   | enforced                                                                  |
|-------------------------|-----------|---------------------------------------------------------------------------|
| `subscriptions`         | 100       | creating one past it answers 409 (the team's own: consumers' count apart) |
| `consumers`             | 100,000   | creating one past it answers 409                                          |
| `subscriptions_per_consumer` | 10   | creating a consumer's subscription past it answers 409                    |
| `events_per_second`     | 100,000   | ingest: a token bucket per team in Redis, shared by every web process;    |
|                         |           | a batch takes as many tokens as it has events; past it 429 + Retry-After  |
| `queued_deliveries`     | 100,000   | ingest: owed deliveries (pending, scheduled, held, dead) past it → 429;   |
|                         |           | the default keeps a team's Redis use in its budget (docs/operating.md)    |
| `test_event_seconds`    | 5         | at most one test event per subscription this often; sooner → 429         |
| `event_types`           | 200       | declaring a new type past it answers 409                                  |
| `event_type_versions`   | 50        | declaring a version of a type past it answers 409                         |
| `catalog_bytes`         | 2,000,000 | schemas and descriptions as stored; a declaration past it answers 413     |
| `declarations_per_minute` | 60      | event-type declarations per team per minute (in Redis); past it 429       |

Admins override any of them per team (`promesa teams quota`, the /quotas page); overrides live in
team_quotas (the database is the truth) and are copied into the team's Redis hash, where ingest's one
Lua script reads them with the bucket: the events-per-second and queued-deliveries checks cost ingest no
database read, and at most one Redis round trip per request. A web process takes a lease with that call
(1 % of the rate, 0.1 % of the owed ceiling) and admits the next requests from it for up to a second,
giving back what is left with its next call; a lease is real tokens, so leases never let more than the
rate through, and a lowered quota reaches every process within the second. The owed count is counted by
the sweeper once a pass (from ix_deliveries_owed, an index of the owed rows alone) and raised by ingest as
it stores deliveries (or leases room for them), so between passes it overestimates by at most the leases.
A flushed Redis is rebuilt by the next pass, and until then the defaults apply. When Redis is away, ingest
is let through: quotas protect the service, and refusing every event would be the outage they guard against.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from dataclasses import dataclass

import redis
from flask import current_app
from sqlalchemy import Text, cast, func, select, update

from dashboard import audit
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.models import (
    AuditEntry,
    Consumer,
    Delivery,
    DeliveryState,
    EventType,
    Subscription,
    Team,
    TeamQuota,
)
from dashboard.queue import clients
from dashboard.queue.work import client_options, connect

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Quota:
    name: str
    default: int
    lowest: int
    highest: int
    words: str  # what it limits, for people


QUOTAS = {q.name: q for q in (
    Quota("subscriptions", 100, 0, 1_000_000, "subscriptions per team (of no consumer: consumers' count apart)"),
    Quota("consumers", 100_000, 0, 10_000_000, "consumers per team"),
    Quota("subscriptions_per_consumer", 10, 0, 1_000, "subscriptions per consumer"),
    Quota("events_per_second", 100_000, 1, 10_000_000, "events per second accepted at ingest (a batch counts "
                                                          "as its number of events)"),
    Quota("queued_deliveries", 100_000, 0, 1_000_000_000, "deliveries owed (pending, scheduled, held or dead) "
                                                              "past which ingest refuses events"),
    Quota("test_event_seconds", 5, 0, 86_400, "seconds between two test events to one subscription"),
    Quota("event_types", 200, 0, 100_000, "event types (names) in the team's catalog"),
    Quota("event_type_versions", 50, 1, 10_000, "versions of one event type in the catalog"),
    Quota("catalog_bytes", 2_000_000, 0, 1_000_000_000, "bytes of the catalog: schemas and descriptions as stored"),
    Quota("declarations_per_minute", 60, 0, 100_000, "event-type declarations a minute (refused ones count too)"),
)}
# Seconds a producer is told to wait when the owed deliveries are past the ceiling (they drain, or the next
# sweep counts them again).
OWED_RETRY_AFTER_SECONDS = 60
# After Redis failed, ingest asks it again only this much later: each request would otherwise wait its timeout.
REDIS_BACKOFF_SECONDS = 5.0
# Ingest waits at most this long for the quota script (or PROMESA_REDIS_TIMEOUT_SECONDS, if shorter).
REDIS_TIMEOUT_SECONDS = 0.25


class QuotaExceeded(ApiError):
    """429 with Retry-After and a JSON body naming the quota: {"error", "quota", "limit", "retry_after_seconds"}."""

    def __init__(self, quota: str, limit: int, retry_after: float | None, message: str, status: int = 429):
        seconds = None if retry_after is None else max(1, math.ceil(retry_after))
        super().__init__(status, message)
        self.fields = {"quota": quota, "limit": limit}
        if seconds is not None:
            self.fields["retry_after_seconds"] = seconds
            self.headers = {"Retry-After": str(seconds)}


# -- the values -----------------------------------------------------------------------------------
def overrides(team_id: int) -> dict[str, int]:
    return dict(db.session.execute(select(TeamQuota.name, TeamQuota.value).where(TeamQuota.team_id == team_id)).all())


def limits(team_id: int) -> dict[str, int]:
    """Every quota's value for the team: its override, else the default."""
    own = overrides(team_id)
    return {name: own.get(name, q.default) for name, q in QUOTAS.items()}


def limit(team_id: int, name: str) -> int:
    value = db.session.scalar(select(TeamQuota.value).where(TeamQuota.team_id == team_id, TeamQuota.name == name))
    return QUOTAS[name].default if value is None else value


def subscriptions_used(team_id: int, consumer_id: int | None = None) -> int:
    """The team's own live subscriptions, or one consumer's."""
    return db.session.scalar(select(func.count()).select_from(Subscription).where(
        Subscription.team_id == team_id, Subscription.consumer_id.is_(None) if consumer_id is None
        else Subscription.consumer_id == consumer_id, Subscription.deleted_at.is_(None))) or 0


def consumers_used(team_id: int) -> int:
    return db.session.scalar(select(func.count()).select_from(Consumer).where(
        Consumer.team_id == team_id, Consumer.deleted_at.is_(None))) or 0


_OWED_BY_TEAM = select(Subscription.team_id, func.count()).select_from(Delivery) \
    .join(Subscription, Subscription.id == Delivery.subscription_id) \
    .where(Delivery.state.in_(DeliveryState.OWED)).group_by(Subscription.team_id)


def owed_by_team(team_id: int | None = None) -> dict[int, int]:
    """Owed deliveries per team, counted from ix_deliveries_owed (the owed rows alone, by subscription)."""
    query = _OWED_BY_TEAM if team_id is None else _OWED_BY_TEAM.where(Subscription.team_id == team_id)
    return dict(db.session.execute(query).all())


def describe(team: Team, owed: dict[int, int] | None = None) -> dict:
    """What /api/v1/team and the quotas page show: each quota's limit, whether it is the team's own, and use.
    `owed`: owed_by_team() already counted for many teams (an index-only count: about 0.3 µs per owed row)."""
    own = overrides(team.id)
    owed = owed_by_team(team.id) if owed is None else owed
    used = {"subscriptions": subscriptions_used(team.id), "queued_deliveries": owed.get(team.id, 0),
            "consumers": consumers_used(team.id)}
    used |= catalog_used(team.id)
    return {name: {"limit": own.get(name, q.default), "default": q.default, "overridden": name in own,
                   "used": used.get(name), "description": q.words} for name, q in QUOTAS.items()}


def set_override(team: Team, name: str, value: int | None, actor: tuple[str, str] | None = None) -> None:
    """An admin's override (None: back to the default); audited, and copied into Redis at once."""
    quota = QUOTAS.get(name)
    if quota is None:
        raise ApiError(400, f"unknown quota {name!r}; the quotas are {', '.join(QUOTAS)}")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not quota.lowest <= value <= quota.highest):
        raise ApiError(400, f"{name} must be a whole number from {quota.lowest} to {quota.highest}")
    row = db.session.get(TeamQuota, (team.id, name))
    before = None if row is None else row.value
    actor = actor or audit.current_actor()
    if value is None:
        if row is not None:
            db.session.delete(row)
    else:
        row = row or TeamQuota(team_id=team.id, name=name)
        row.value, row.updated_at, row.updated_by = value, current_app.config["CLOCK"].now(), actor[1]
        db.session.add(row)
    audit.record("team.quota_changed", team_id=team.id, actor=actor, target=f"quota:{name}",
                 detail={"before": before, "after": value, "default": quota.default})
    db.session.commit()
    publish_limits([team.id])


# -- subscriptions and test events (not the hot path: plain database reads) --------------------------
def _hold(model, row_id) -> None:
    """Hold the row until the transaction ends, so requests that check and then write through it take turns:
    PostgreSQL locks the row (NO KEY UPDATE: inserts referring to it still go ahead); SQLite has one writer at
    a time, so a write that changes nothing takes that turn."""
    if db.session.get_bind().dialect.name == "postgresql":
        db.session.execute(select(model.id).where(model.id == row_id).with_for_update(key_share=True))
    else:
        db.session.execute(update(model).where(model.id == row_id).values(id=model.id)
                           .execution_options(synchronize_session=False))


def check_subscription_room(team: Team, consumer: Consumer | None = None) -> None:
    """Holds the team's row (or the consumer's) until the caller commits: concurrent creations count one after
    another. A consumer's subscriptions count against its own quota, not the team's."""
    if consumer is not None:
        _hold(Consumer, consumer.id)
        allowed = limit(team.id, "subscriptions_per_consumer")
        if subscriptions_used(team.id, consumer.id) >= allowed:
            raise QuotaExceeded("subscriptions_per_consumer", allowed, None,
                                f"consumer {consumer.uid} has its {allowed} subscriptions (the "
                                "subscriptions_per_consumer quota); delete one, or ask an admin to raise it",
                                status=409)
        return
    _hold(Team, team.id)
    allowed = limit(team.id, "subscriptions")
    if subscriptions_used(team.id) >= allowed:
        raise QuotaExceeded("subscriptions", allowed, None, f"team {team.name} has its {allowed} subscriptions (the "
                            "subscriptions quota); delete one, or ask an admin to raise it", status=409)


def check_consumer_room(team: Team) -> None:
    """Holds the team's row until the caller commits: concurrent creations count one after another."""
    _hold(Team, team.id)
    allowed = limit(team.id, "consumers")
    if consumers_used(team.id) >= allowed:
        raise QuotaExceeded("consumers", allowed, None, f"team {team.name} has its {allowed} consumers (the "
                            "consumers quota); delete one, or ask an admin to raise it", status=409)


def check_test_event(sub: Subscription) -> None:
    """At most one test event per subscription every `test_event_seconds`. Holds the subscription's row until
    the caller commits the test event's audit entry: the latest one (ix_audit_entries_subscription_at) says
    when the last test event went."""
    _hold(Subscription, sub.id)
    interval = limit(sub.team_id, "test_event_seconds")
    last_sent = db.session.scalar(select(func.max(AuditEntry.at)).where(
        AuditEntry.subscription_id == sub.id, AuditEntry.action == "subscription.test_sent"))
    if last_sent is None or not interval:
        return
    waited = (current_app.config["CLOCK"].now() - last_sent).total_seconds()
    if waited < interval:
        raise QuotaExceeded("test_event_seconds", interval, interval - waited,
                            f"one test event per subscription every {interval} s (the test_event_seconds quota)")


# -- the event-type catalog (declarations are rare: plain database reads, and a counter in Redis) -------
def catalog_used(team_id: int, name: str | None = None) -> dict[str, int]:
    """The team's event types, the versions of its type with the most (or of `name`), and its stored bytes."""
    of_team = EventType.team_id == team_id
    types, stored = db.session.execute(select(func.count(func.distinct(EventType.name)), func.coalesce(func.sum(
        func.length(cast(EventType.schema, Text)) + func.length(EventType.description)), 0)).where(of_team)).one()
    per_type = select(func.count().label("n")).where(of_team, *([EventType.name == name] if name else [])) \
        .group_by(EventType.name).subquery()
    versions = db.session.scalar(select(func.coalesce(func.max(per_type.c.n), 0)))
    return {"event_types": types, "event_type_versions": versions, "catalog_bytes": int(stored)}


def check_catalog_room(team: Team, name: str, size: int) -> None:
    """Room in the team's catalog for a declaration of `name` storing `size` bytes: 409 past a count (as for
    subscriptions), 413 past the bytes. The team's row is locked first, so two declarations cannot both take
    the last room."""
    db.session.execute(select(Team.id).where(Team.id == team.id).with_for_update())
    used, allowed = catalog_used(team.id, name), limits(team.id)
    if used["event_type_versions"] == 0 and used["event_types"] >= allowed["event_types"]:
        raise QuotaExceeded("event_types", allowed["event_types"], None, f"team {team.name} has its "
                            f"{allowed['event_types']} event types (the event_types quota); ask an admin to raise it",
                            status=409)
    if used["event_type_versions"] >= allowed["event_type_versions"]:
        raise QuotaExceeded("event_type_versions", allowed["event_type_versions"], None, f"{name} has its "
                            f"{allowed['event_type_versions']} versions (the event_type_versions quota); ask an "
                            "admin to raise it", status=409)
    if used["catalog_bytes"] + size > allowed["catalog_bytes"]:
        raise QuotaExceeded("catalog_bytes", allowed["catalog_bytes"], None, f"this declaration stores {size} bytes "
                            f"and the catalog holds {used['catalog_bytes']}: {used['catalog_bytes'] + size - allowed['catalog_bytes']} "
                            f"past the catalog_bytes quota of {allowed['catalog_bytes']}", status=413)


def check_declaration_rate(team: Team) -> None:
    """At most declarations_per_minute declarations per team in each minute of the clock, counted in Redis (every
    web process shares the count); let through when Redis is away."""
    allowed = limit(team.id, "declarations_per_minute")
    app = current_app._get_current_object()
    now = app.config["CLOCK"].now().replace(tzinfo=dt.timezone.utc).timestamp()
    minute = int(now // 60)
    key = f"{team_key(app, team.id)}:declarations:{minute}"
    try:
        pipe = connect(app).pipeline(transaction=True)
        counted = pipe.incr(key).expire(key, 120).execute()[0]
    except redis.RedisError as error:
        log.warning("quotas: Redis unavailable (%s); declarations go on unthrottled", type(error).__name__)
        return
    if counted > allowed:
        raise QuotaExceeded("declarations_per_minute", allowed, (minute + 1) * 60 - now, f"past the "
                            f"declarations_per_minute quota of {allowed} event-type declarations a minute")


# -- ingest's bucket, in Redis ---------------------------------------------------------------------
# KEYS[1]: the team's hash: rate and owed_max (overrides, copied from the database), owed (the sweeper's count
# plus what ingest stored since), tokens and at (the bucket).
# ARGV: now (unix s), events, deliveries, default rate, default owed ceiling, tokens and owed deliveries given
# back (what was left of this process's last lease), the lease's share of the rate and of the ceiling.
# Answers {0, lease tokens, lease owed} (admitted), {1, wait seconds, rate} (past the rate) or {2, owed, ceiling}
# (past the owed ceiling). A bucket holds one second of its rate; a batch larger than that goes when the bucket
# is full, leaving a debt.
_ADMIT = """
local now, events, deliveries = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local v = redis.call('HMGET', KEYS[1], 'rate', 'owed_max', 'owed', 'tokens', 'at')
local rate = tonumber(v[1]) or tonumber(ARGV[4])
local owed_max = tonumber(v[2]) or tonumber(ARGV[5])
local owed = math.max(0, (tonumber(v[3]) or 0) - tonumber(ARGV[7]))
local tokens, at = tonumber(v[4]), tonumber(v[5])
if tokens == nil or at == nil then tokens, at = rate, now end
if now > at then
  tokens = tokens + (now - at) * rate
  at = now
end
tokens = math.min(rate, tokens + tonumber(ARGV[6]))  -- (a lowered rate applies at once)
local answer
local needed = math.min(events, rate)
if deliveries > 0 and owed + deliveries > owed_max then
  answer = {2, owed, owed_max}
elseif tokens + 1e-6 < needed then  -- (times are sent to the microsecond)
  answer = {1, string.format('%.6f', (needed - tokens) / rate), rate}
else
  tokens = tokens - events
  owed = owed + deliveries
  local lease = math.floor(math.min(rate * tonumber(ARGV[8]), math.max(0, tokens)))
  local lease_owed = 0
  if lease > 0 then lease_owed = math.floor(math.min(owed_max * tonumber(ARGV[9]), owed_max - owed)) end
  tokens, owed = tokens - lease, owed + lease_owed
  answer = {0, lease, lease_owed}
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'at', string.format('%.6f', at), 'owed', owed)
return answer
"""
# A web process takes this share of its team's rate (and of the owed ceiling) with the tokens a request needs,
# and admits the next requests from it without asking Redis, for at most LEASE_SECONDS; what is left goes back
# with its next call. Rates under 1 / LEASE_SHARE events per second get no lease: every request asks.
LEASE_SHARE = 0.01
OWED_LEASE_SHARE = 0.001
LEASE_SECONDS = 1.0


def team_key(app, team_id: int) -> str:
    return f"{app.config['PROMESA_REDIS_PREFIX']}:quota:{team_id}"


@dataclass
class Lease:
    """Tokens and owed deliveries one process took from its team's bucket ahead of its requests."""
    tokens: int = 0
    owed: int = 0
    until: float = -math.inf  # (unix s, on the app's clock)

    def covers(self, events: int, deliveries: int, now: float) -> bool:
        return now < self.until and self.tokens >= events and self.owed >= deliveries


class Bucket:
    """One per app: the script on a client whose calls wait at most REDIS_TIMEOUT_SECONDS, this process's leases
    per team, and when Redis last failed (ingest then lets events through without asking for
    REDIS_BACKOFF_SECONDS)."""

    def __init__(self, app):
        shared = connect(app)
        timeout = min(REDIS_TIMEOUT_SECONDS, app.config["PROMESA_REDIS_TIMEOUT_SECONDS"])
        url = app.config.get("REDIS_URL")
        self.conn = clients.from_url(url, **client_options(timeout)) if url else shared
        self.script = self.conn.register_script(_ADMIT)
        self.failed_at = -math.inf
        self.leases: dict[int, Lease] = {}
        self.lock = threading.Lock()  # (the web server's threads share the leases)

    @classmethod
    def for_app(cls, app) -> Bucket:
        bucket = app.extensions.get("promesa_quota_bucket")
        if bucket is None:
            bucket = app.extensions["promesa_quota_bucket"] = cls(app)
        return bucket

    def take_leased(self, team_id: int, events: int, deliveries: int, now: float) -> Lease | None:
        """None: admitted from this process's lease. Otherwise the lease, taken back (perhaps empty): what is
        left of it goes back to Redis with the call that admits the request."""
        with self.lock:
            lease = self.leases.get(team_id)
            if lease is not None and lease.covers(events, deliveries, now):
                lease.tokens -= events
                lease.owed -= deliveries
                return None
            return self.leases.pop(team_id, None) or Lease()

    def keep(self, team_id: int, tokens: int, owed: int, now: float) -> None:
        if tokens > 0:
            with self.lock:
                self.leases[team_id] = Lease(tokens, owed, now + LEASE_SECONDS)

    def forget(self, team_ids) -> None:
        """Drop this process's leases (its quotas changed): the next request asks Redis."""
        with self.lock:
            for team_id in team_ids:
                self.leases.pop(team_id, None)


def admit(team_id: int, events: int, deliveries: int) -> None:
    """Take `events` tokens from the team's bucket and count its new owed deliveries, or raise QuotaExceeded:
    from this process's lease when it covers them, else one Redis round trip. Let through when Redis is away."""
    app = current_app._get_current_object()
    bucket = Bucket.for_app(app)
    now = app.config["CLOCK"].now().replace(tzinfo=dt.timezone.utc).timestamp()
    returned = bucket.take_leased(team_id, events, deliveries, now)
    if returned is None:
        return
    if time.monotonic() - bucket.failed_at < REDIS_BACKOFF_SECONDS:
        return
    try:
        answer = bucket.script(keys=[team_key(app, team_id)], args=[
            f"{now:.6f}", events, deliveries, QUOTAS["events_per_second"].default,
            QUOTAS["queued_deliveries"].default, returned.tokens, returned.owed, LEASE_SHARE, OWED_LEASE_SHARE],
            client=bucket.conn)
    except redis.RedisError as error:
        bucket.failed_at = time.monotonic()
        log.warning("quotas: Redis unavailable (%s); ingest goes on unthrottled for %.0f s", type(error).__name__,
                    REDIS_BACKOFF_SECONDS)
        return
    if answer[0] == 0:
        bucket.keep(team_id, int(answer[1]), int(answer[2]), now)
    elif answer[0] == 1:
        rate = int(answer[2])
        raise QuotaExceeded("events_per_second", rate, float(answer[1]),
                            f"past the events_per_second quota of {rate} events per second for this team")
    else:
        ceiling = int(answer[2])
        raise QuotaExceeded("queued_deliveries", ceiling, OWED_RETRY_AFTER_SECONDS,
                            f"this team already owes {int(answer[1])} deliveries; the queued_deliveries quota is "
                            f"{ceiling}: events are refused until its receivers catch up")


def publish_limits(team_ids: list[int] | None = None, owed: dict[int, int] | None = None) -> None:
    """Copy overrides (and, when given, the owed counts) into the teams' Redis hashes."""
    app = current_app._get_current_object()
    query = select(TeamQuota.team_id, TeamQuota.name, TeamQuota.value).where(
        TeamQuota.name.in_(("events_per_second", "queued_deliveries")))
    if team_ids is not None:
        query = query.where(TeamQuota.team_id.in_(team_ids))
    rows = db.session.execute(query).all()
    teams = set(team_ids) if team_ids is not None else set(db.session.scalars(select(Team.id)))
    fields = {"events_per_second": "rate", "queued_deliveries": "owed_max"}
    bucket = app.extensions.get("promesa_quota_bucket")
    if bucket is not None:
        bucket.forget(teams)
    conn = connect(app)
    try:
        pipe = conn.pipeline(transaction=True)  # ingest never sees a hash between the delete and the set
        for team_id in teams:
            pipe.hdel(team_key(app, team_id), *fields.values())
            if owed is not None:
                pipe.hset(team_key(app, team_id), "owed", owed.get(team_id, 0))
        for team_id, name, value in rows:
            pipe.hset(team_key(app, team_id), fields[name], value)
        pipe.execute()
    except redis.RedisError as error:
        log.warning("quotas: could not copy the quotas into Redis (%s); the next sweep does", type(error).__name__)


def refresh(_now=None) -> dict[int, int]:
    """The sweeper's step: count every team's owed deliveries and copy them and the overrides into Redis."""
    owed = owed_by_team()
    publish_limits(None, owed)
    db.session.commit()
    return owed
