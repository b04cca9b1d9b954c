"""The database is the source of truth: every event, delivery and attempt lives here.

Redis only ever holds ids of work to do (see `dashboard.queue.work`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets

from flask_login import UserMixin
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    case,
    select,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship
from werkzeug.security import check_password_hash, generate_password_hash

from dashboard.core.clock import utcnow
from dashboard.core.extensions import db
from dashboard.core.ids import new_id

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a BIGINT.
BigId = BigInteger().with_variant(Integer(), "sqlite")


# The type of the event "Send test event" sends: delivered and listed like any other, but no health figure
# (outcome counts, success rates, incident rules) counts it, so trying an endpoint never makes it look broken.
TEST_EVENT_TYPE = "promesa.test"


class DeliveryState:
    PENDING = "pending"
    SCHEDULED = "scheduled"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    HELD = "held"
    # The subscription was deleted while the delivery waited: nothing more is attempted.
    CANCELLED = "cancelled"
    # A dead letter an operator gave up on for good: never sent again, still readable.
    DISCARDED = "discarded"

    ALL = (PENDING, SCHEDULED, SUCCEEDED, DEAD, HELD, CANCELLED, DISCARDED)
    # Not finished yet: what deleting a subscription cancels.
    WAITING = (PENDING, SCHEDULED, HELD)
    # States a worker may pick up once next_attempt_at has come.
    DUE = (PENDING, SCHEDULED)
    # Not delivered and still owed: what the overview counts per subscription.
    OWED = (PENDING, SCHEDULED, HELD, DEAD)


class SubscriptionState:
    ACTIVE = "active"
    PAUSED = "paused"
    DISABLED = "disabled"

    ALL = (ACTIVE, PAUSED, DISABLED)


class SubscriptionMode:
    PUSH = "push"  # POSTed to its URL by the workers
    PULL = "pull"  # leased to the client that fetches it, settled by its ack (dashboard.delivery.pull)

    ALL = (PUSH, PULL)


PULL_TARGET = "pull: fetched by the receiver"
LISTEN_TARGET = "pull: listen session (temporary, removed when idle)"
# A listen session's last pull is written at most this often: one UPDATE per session every few seconds.
LISTEN_SEEN_EVERY = dt.timedelta(seconds=5)


class ConsumerState:
    ACTIVE = "active"
    # Its deliveries are held, as for a paused subscription, until it is enabled again.
    DISABLED = "disabled"

    ALL = (ACTIVE, DISABLED)


class Team(db.Model):
    __tablename__ = "teams"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    # Strict: only event types declared in the catalog are accepted.
    strict_event_types: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    # The consumer portal's look and who may frame it (dashboard.consumers.portal checks them).
    portal_frame_ancestors: Mapped[list | None] = mapped_column(JSON)
    portal_accent: Mapped[str | None] = mapped_column(String(7))
    portal_logo_url: Mapped[str | None] = mapped_column(String(500))

    subscriptions: Mapped[list[Subscription]] = relationship(back_populates="team")


_ADDRESSED = text("consumer_id IS NOT NULL")
_LIVE_LISTEN_SESSIONS = text("listen_seen_at IS NOT NULL AND deleted_at IS NULL")
# A consumer's uid: the producer's own id for the party (its customer, an app), unique within the team.
CONSUMER_UID_PATTERN = r"^[A-Za-z0-9._:-]{1,100}$"
_LIVE = text("deleted_at IS NULL")


class Consumer(db.Model):
    """The party an event is about and for: a producing team's customer. An event addressed to it reaches only
    its own subscriptions (dashboard.ingest.accept); a disabled one's deliveries are held; a deleted one is out
    of routing, and its uid may name a new consumer (its events stay with the old row)."""

    __tablename__ = "consumers"
    __table_args__ = (
        # Unique among the live ones; "C" on PostgreSQL: a uid prefix is an index range, in byte order.
        Index("uq_consumers_team_uid", "team_id", "uid", unique=True, postgresql_where=_LIVE, sqlite_where=_LIVE),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"))
    uid: Mapped[str] = mapped_column(String(100).with_variant(String(100, collation="C"), "postgresql"))
    name: Mapped[str] = mapped_column(String(200), default="")
    # A small JSON object the producer keeps with it (size-capped in dashboard.consumers.service).
    meta: Mapped[dict | None] = mapped_column("metadata", JSON)
    state: Mapped[str] = mapped_column(String(16), default=ConsumerState.ACTIVE)
    state_reason: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    deleted_at: Mapped[dt.datetime | None] = mapped_column(DateTime)

    team: Mapped[Team] = relationship()


class PortalLink(db.Model):
    """A sign-in link a producer hands one consumer, and the portal session it opens (dashboard.consumers.portal).
    Only hashes of the link's and the session's random tokens are kept; the session ends when the link expires."""

    __tablename__ = "portal_links"
    __table_args__ = (Index("ix_portal_links_consumer", "consumer_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"))
    consumer_id: Mapped[int] = mapped_column(ForeignKey("consumers.id"))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    session_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    created_by: Mapped[str] = mapped_column(String(254))
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime)
    opened_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime)

    consumer: Mapped[Consumer] = relationship()


class TeamQuota(db.Model):
    """An admin's override of one quota for one team (dashboard.ingest.quotas names them and their defaults)."""

    __tablename__ = "team_quotas"

    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"), primary_key=True)
    name: Mapped[str] = mapped_column(String(40), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime)
    updated_by: Mapped[str] = mapped_column(String(254))


# The dashboard's roles; what each may do is decided in dashboard.accounts.access.
ROLES = ("admin", "operator", "oncall", "owner", "member")


class User(UserMixin, db.Model):
    __tablename__ = "users"

    ROLES = ROLES

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    email: Mapped[str] = mapped_column(String(254), unique=True)
    password_hash: Mapped[str] = mapped_column(String(256))
    role: Mapped[str] = mapped_column(String(20), default="member")
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id"))
    # A deactivated user cannot sign in, and a session already open stops working (Flask-Login's is_active).
    active: Mapped[bool] = mapped_column(Boolean, default=True, server_default=text("true"))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    # Part of every session's id: raising it ends all of the user's sessions (the cookie alone cannot).
    session_version: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))

    team: Mapped[Team | None] = relationship()

    @property
    def is_active(self) -> bool:
        return self.active

    def get_id(self) -> str:
        """What Flask-Login keeps in the session cookie: the user and the session version it was issued for."""
        return f"{self.id}:{self.session_version}"

    def end_sessions(self) -> None:
        """Every session cookie issued so far stops working, copies included."""
        self.session_version += 1

    def set_password(self, password: str) -> None:
        self.password_hash = generate_password_hash(password)

    def check_password(self, password: str) -> bool:
        return check_password_hash(self.password_hash, password)


class ApiToken(db.Model):
    """A team's producer token. Only its SHA-256 is stored: the token is shown once."""

    __tablename__ = "api_tokens"
    PREFIX = "pk_"
    DISPLAY_LENGTH = 10  # how much of a token is kept in the clear, to name it in lists

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    display_prefix: Mapped[str] = mapped_column(String(16))
    # What it is for ("billing producer"), who made it, and when it stops working (None: never).
    name: Mapped[str] = mapped_column(String(100), default="", server_default="")
    created_by: Mapped[str | None] = mapped_column(String(254))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime)

    team: Mapped[Team] = relationship()
    use: Mapped[ApiTokenUse | None] = relationship(viewonly=True)

    def expired(self, now: dt.datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    @staticmethod
    def digest(token: str) -> str:
        return hashlib.sha256(token.encode("utf-8")).hexdigest()

    @classmethod
    def issue(cls, team: Team) -> tuple[ApiToken, str]:
        token = cls.PREFIX + secrets.token_urlsafe(32)
        return cls(team=team, token_sha256=cls.digest(token), display_prefix=token[:cls.DISPLAY_LENGTH]), token


class ApiTokenUse(db.Model):
    """When a token was last used, at most once a minute. Apart from api_tokens, a routing table: a write
    there moves the routing generation and empties every process's kept routing (ingest.routing_cache)."""

    __tablename__ = "api_token_uses"

    token_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id"), primary_key=True)
    last_used_at: Mapped[dt.datetime] = mapped_column(DateTime)


# The retry schedules a subscription may choose (each is a policy in dashboard.delivery.policies).
RETRY_POLICY_NAMES = ("exponential", "quick-then-sweep")


def held_values(state: str, reason: str) -> dict:
    """The columns that take a subscription out of delivery (paused or disabled), and say why."""
    return {"state": state, "state_reason": reason}


def previous_signs(expires_at: dt.datetime | None, now: dt.datetime) -> bool:
    """Does a previous secret with this grace end still sign at `now`? (The engine asks per delivery.)"""
    return expires_at is not None and now < expires_at


class Subscription(db.Model):
    __tablename__ = "subscriptions"
    # Routing reads a team's subscriptions of no consumer, or of one consumer, never all of them; a consumer's
    # page, its counts and a consumer's removal find its subscriptions by the second.
    __table_args__ = (Index("ix_subscriptions_team_consumer", "team_id", "consumer_id"),
                      Index("ix_subscriptions_consumer_id", "consumer_id", postgresql_where=_ADDRESSED,
                            sqlite_where=_ADDRESSED),
                      Index("uq_subscriptions_pull_key_sha256", "pull_key_sha256", unique=True),
                      # The sweeper's pass reads the live listen sessions alone, for the idle ones.
                      Index("ix_subscriptions_listen_seen_at", "listen_seen_at",
                            postgresql_where=_LIVE_LISTEN_SESSIONS, sqlite_where=_LIVE_LISTEN_SESSIONS))

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("sub"))
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"), index=True)
    # The consumer whose endpoint this is (None: the team's own, for its unaddressed events).
    consumer_id: Mapped[int | None] = mapped_column(ForeignKey("consumers.id"))
    # None for a pull subscription: its receiver fetches its deliveries.
    url: Mapped[str | None] = mapped_column(String(2048))
    mode: Mapped[str] = mapped_column(String(8), default=SubscriptionMode.PUSH, server_default=SubscriptionMode.PUSH)
    # A pull subscription's own key (dashboard.subscriptions.pull_keys): it pulls and acks this subscription and
    # nothing else. Kept as its SHA-256, and its first characters to tell it by; None for a push subscription.
    pull_key_sha256: Mapped[str | None] = mapped_column(String(64))
    pull_key_prefix: Mapped[str | None] = mapped_column(String(16))
    # Not a column: the key of a pull subscription just made, for the answer that shows it once.
    new_pull_key = None
    # A listen session (a pull subscription `promesa-receiver listen` made for itself): when its client last
    # pulled, within LISTEN_SEEN_EVERY; the sweeper deletes one idle too long. None: not a listen session.
    listen_seen_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    description: Mapped[str] = mapped_column(String(500), default="")
    event_types: Mapped[list] = mapped_column(JSON, default=lambda: ["*"])
    # {"file.updated": 2}: receive only that version of that type; types not named arrive in every version.
    event_versions: Mapped[dict] = mapped_column(JSON, default=dict)
    retry_policy: Mapped[str] = mapped_column(String(32), default="exponential")
    signature_scheme: Mapped[str] = mapped_column(String(32), default="promesa")
    state: Mapped[str] = mapped_column(String(16), default=SubscriptionState.ACTIVE)
    state_reason: Mapped[str | None] = mapped_column(String(500))
    # Fernet ciphertext of the signing secret (see dashboard.core.crypto).
    secret_ciphertext: Mapped[str] = mapped_column(Text)
    # After a rotation, the secret before it keeps signing too (encrypted) until its grace ends.
    previous_secret_ciphertext: Mapped[str | None] = mapped_column(Text)
    previous_secret_expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    # The receiver's own headers (an API key its gateway demands), as Fernet ciphertext of a JSON object
    # {name: value}: values are credentials (dashboard.subscriptions.own_headers). None: no headers of its own.
    headers_ciphertext: Mapped[str | None] = mapped_column(Text)
    # OAuth2 client credentials (token URL, client id and secret, scope, audience), as Fernet ciphertext of a
    # JSON object (dashboard.subscriptions.client_auth). None: no token is fetched.
    auth_ciphertext: Mapped[str | None] = mapped_column(Text)
    # A client certificate for mutual TLS: Fernet ciphertext of a JSON object with the certificate, its key
    # and an extra CA bundle (dashboard.subscriptions.client_tls); what may be shown of the certificate is
    # kept in clear beside it. None: no certificate is presented.
    tls_ciphertext: Mapped[str | None] = mapped_column(Text)
    tls_subject: Mapped[str | None] = mapped_column(String(500))
    tls_issuer: Mapped[str | None] = mapped_column(String(500))
    tls_expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    # Deliveries per second across all workers (None: no limit), enforced in Redis (delivery.ratelimit).
    rate_limit_per_s: Mapped[float | None] = mapped_column(Float)
    # Requests in flight to this endpoint per worker (None: PROMESA_MAX_IN_FLIGHT_PER_SUBSCRIPTION).
    max_in_flight: Mapped[int | None] = mapped_column(Integer)
    connect_timeout: Mapped[float] = mapped_column(Float, default=5.0)
    attempt_timeout: Mapped[float] = mapped_column(Float, default=10.0)
    max_age_seconds: Mapped[int] = mapped_column(Integer, default=24 * 3600)
    # The payload filter (dashboard.subscriptions.filters): of the events of its types, only those it admits
    # get a delivery, decided at ingest. None (SQL NULL): every one.
    filter: Mapped[dict | None] = mapped_column(JSON(none_as_null=True))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)
    # Soft deletion: out of routing and the API's list, its history still readable.
    deleted_at: Mapped[dt.datetime | None] = mapped_column(DateTime)

    team: Mapped[Team] = relationship(back_populates="subscriptions")
    consumer: Mapped[Consumer | None] = relationship()

    @property
    def listen(self) -> bool:
        return self.listen_seen_at is not None

    @property
    def target(self) -> str:
        """Where its deliveries go, as pages name it: its URL, or (pull) that its receiver fetches them, or
        that a listen session does."""
        if self.mode != SubscriptionMode.PULL:
            return self.url
        return LISTEN_TARGET if self.listen else PULL_TARGET

    def listen_seen_due(self, now: dt.datetime) -> bool:
        """Is this a listen session whose last pull should be written now (LISTEN_SEEN_EVERY)?"""
        return self.listen_seen_at is not None and now - self.listen_seen_at >= LISTEN_SEEN_EVERY


def delivering_state(subscriptions, consumers):
    """A subscription's state as delivery reads it (tables or aliases, the consumers one outer-joined):
    disabled while its consumer is disabled, whatever its own."""
    return case((consumers.c.state == ConsumerState.DISABLED, SubscriptionState.DISABLED),
                else_=subscriptions.c.state)


class EventType(db.Model):
    """A declared event type version: what `data` must look like. Versions are immutable:
    an incompatible change is a new version."""

    __tablename__ = "event_types"
    __table_args__ = (UniqueConstraint("team_id", "name", "version", name="uq_event_types_team_name_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"))
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer)
    description: Mapped[str] = mapped_column(String(1000), default="")
    # JSON Schema of the event's `data`.
    schema: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class Event(db.Model):
    __tablename__ = "events"
    __table_args__ = (UniqueConstraint("team_id", "idempotency_key", name="uq_events_team_idempotency_key"),
                      UniqueConstraint("team_id", "id", name="uq_events_team_id"),
                      Index("ix_events_type_created_at", "type", "created_at"),  # event search by type
                      # A consumer's events since a time ("replay since"), and the events page's consumer filter.
                      Index("ix_events_consumer_created_at", "consumer_id", "created_at",
                            postgresql_where=_ADDRESSED, sqlite_where=_ADDRESSED))

    # Promesa's own id for the row, unique across teams: what deliveries reference. Never shown.
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    # The event id producers and receivers see (the producer's own, or the key): unique in its team only,
    # so look events up by (team_id, id), never by id alone.
    id: Mapped[str] = mapped_column(String(64))
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"))
    type: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer, default=1)
    data: Mapped[dict] = mapped_column(JSON)
    # The exact body sent on every attempt, so id and timestamp never drift between retries.
    body: Mapped[str] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    # data.resource_id, when it is a short string or number: what operators search events by.
    resource_id: Mapped[str | None] = mapped_column(String(200), index=True)
    # The consumer it was addressed to (None: the team's own subscriptions). No foreign key: ingest's write
    # stays one statement, and the consumer row is never removed.
    consumer_id: Mapped[int | None] = mapped_column(Integer)
    occurred_at: Mapped[dt.datetime] = mapped_column(DateTime)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow, index=True)
    # The producer's W3C traceparent (dashboard.core.tracing), sent on every attempt: the receiver's trace joins
    # the producer's. None: it sent none, or an invalid one.
    traceparent: Mapped[str | None] = mapped_column(String(55))

    team: Mapped[Team] = relationship()
    consumer: Mapped[Consumer | None] = relationship(primaryjoin="foreign(Event.consumer_id) == Consumer.id",
                                                     viewonly=True)
    deliveries: Mapped[list[Delivery]] = relationship(back_populates="event", order_by="Delivery.created_at")


_HAS_NEXT_ATTEMPT = text("next_attempt_at IS NOT NULL")
_IS_DEAD = text("state = 'dead'")
_IS_OWED = text("state IN ('pending', 'scheduled', 'held', 'dead')")  # DeliveryState.OWED
_DEAD_LETTER_FILTERED = ["subscription_id", "event_key", "last_status_code", "last_error"]
_REPLAYED = text("replay_id IS NOT NULL")
_SUCCEEDED = text("state = 'succeeded'")
_DISCARDED = text("state = 'discarded'")


class Delivery(db.Model):
    """One event promised to one subscription; its attempts say how the promise is going."""

    __tablename__ = "deliveries"
    __table_args__ = (
        # Only rows with a next attempt: settled deliveries (the history) stay out of the queue's index.
        Index("ix_deliveries_due", "state", "next_attempt_at", postgresql_where=_HAS_NEXT_ATTEMPT,
              sqlite_where=_HAS_NEXT_ATTEMPT),
        Index("ix_deliveries_subscription_state", "subscription_id", "state", "created_at"),
        # The overview's backlog per subscription: counts by (subscription, state) and the oldest due, read
        # from an index of the owed rows alone (a few MB where the one above is tens: it holds the history).
        Index("ix_deliveries_owed", "subscription_id", "state", "next_attempt_at", postgresql_where=_IS_OWED,
              sqlite_where=_IS_OWED),
        # The dead-letter desk: only dead rows, newest first, across subscriptions or within one. On
        # PostgreSQL they carry what the filters read, so a count is an index-only scan.
        Index("ix_deliveries_dead", "dead_lettered_at", "id", postgresql_where=_IS_DEAD, sqlite_where=_IS_DEAD,
              postgresql_include=_DEAD_LETTER_FILTERED),
        Index("ix_deliveries_dead_subscription", "subscription_id", "dead_lettered_at", "id",
              postgresql_where=_IS_DEAD, sqlite_where=_IS_DEAD, postgresql_include=_DEAD_LETTER_FILTERED[1:]),
        # A replay's outcomes so far: its deliveries by state.
        Index("ix_deliveries_replay", "replay_id", "state", postgresql_where=_REPLAYED, sqlite_where=_REPLAYED),
        # Retention's pruning finds the oldest succeeded rows without reading the rest (the oldest dead
        # ones come from ix_deliveries_dead, which leads with dead_lettered_at).
        Index("ix_deliveries_succeeded", "succeeded_at", postgresql_where=_SUCCEEDED, sqlite_where=_SUCCEEDED),
        # ... and the oldest discarded ones (they keep the dead_lettered_at of the dead letter they were).
        Index("ix_deliveries_discarded", "dead_lettered_at", postgresql_where=_DISCARDED, sqlite_where=_DISCARDED),
        # Free room on each page, so a claim (lease columns only) is a heap-only update: no index entries.
        {"postgresql_with": {"fillfactor": 70}},
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("dlv"))
    event_key: Mapped[str] = mapped_column(ForeignKey("events.key"), index=True)  # the event's key, not its id
    subscription_id: Mapped[str] = mapped_column(ForeignKey("subscriptions.id"))
    state: Mapped[str] = mapped_column(String(16), default=DeliveryState.PENDING)
    attempt_count: Mapped[int] = mapped_column(Integer, default=0)
    # attempt_count when the delivery was last replayed: the retry schedule restarts from there.
    retry_base: Mapped[int] = mapped_column(Integer, default=0)
    # When the current retry schedule began (a replay restarts it); None: when the event was accepted.
    schedule_started_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    next_attempt_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    # A worker owns the delivery while lease_expires_at is in the future (claimed by conditional UPDATE).
    lease_token: Mapped[str | None] = mapped_column(String(36))
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    succeeded_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    dead_lettered_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    # The bulk replay that last re-sent this delivery, or the discard that ended it (dashboard.operations.replays).
    replay_id: Mapped[str | None] = mapped_column(String(40))

    event: Mapped[Event] = relationship(back_populates="deliveries")
    subscription: Mapped[Subscription] = relationship()
    attempts: Mapped[list[Attempt]] = relationship(order_by="Attempt.number", back_populates="delivery")


def deliveries_locked(*where):
    """The ids of the deliveries matching `where`, locked in id order (FOR UPDATE; SQLite has no row locks): a
    bulk UPDATE of `Delivery.id.in_()` them takes its locks in the order the workers' writes take theirs, so a
    pause or a delete and a worker's record never wait for each other in a cycle (PostgreSQL's deadlock)."""
    return select(Delivery.id).where(*where).order_by(Delivery.id).with_for_update()


class Attempt(db.Model):
    """One HTTP try: what was sent when, and what came back (or why nothing did)."""

    __tablename__ = "attempts"
    __table_args__ = (Index("ix_attempts_delivery_number", "delivery_id", "number"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(ForeignKey("deliveries.id"))
    number: Mapped[int] = mapped_column(Integer)
    attempted_at: Mapped[dt.datetime] = mapped_column(DateTime)  # not indexed: attempts are read by delivery
    duration_ms: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(String(200))
    response_excerpt: Mapped[str | None] = mapped_column(Text)
    # The answer's headers as "Name: value" lines, at most RESPONSE_HEADERS_BYTES (dashboard.delivery.http).
    response_headers: Mapped[str | None] = mapped_column(Text)

    delivery: Mapped[Delivery] = relationship(back_populates="attempts")


class AuditEntry(db.Model):
    """Who changed what, when: every state change from the dashboard, the API or the system itself."""

    __tablename__ = "audit_entries"
    __table_args__ = (
        Index("ix_audit_entries_subscription_at", "subscription_id", "at"),
        Index("ix_audit_entries_team_at", "team_id", "at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at: Mapped[dt.datetime] = mapped_column(DateTime, index=True)
    # "user", "token" or "system"; actor is then the email, the token's display prefix, or "system".
    actor_kind: Mapped[str] = mapped_column(String(10))
    actor: Mapped[str] = mapped_column(String(254))
    # What happened, as a dotted name: "subscription.paused", "token.revoked", "replay.started".
    action: Mapped[str] = mapped_column(String(60), index=True)
    team_id: Mapped[int | None] = mapped_column(Integer)  # no foreign keys: the log outlives what it names
    subscription_id: Mapped[str | None] = mapped_column(String(40))
    # Another object the change was about (a user, a token, a replay), as "kind:id".
    target: Mapped[str | None] = mapped_column(String(120))
    # How many deliveries the change touched (held, released, replayed), when it touched any.
    deliveries: Mapped[int | None] = mapped_column(Integer)
    # Anything else worth keeping: a reason, before/after of an edit (secrets never).
    detail: Mapped[dict | None] = mapped_column(JSON)


class OutcomeCount(db.Model):
    """Attempts per subscription per minute, by outcome: what every chart, health figure and alert
    rule reads, so none of them scans the attempts table. Written by the delivery engine in the
    same transaction as the attempts it counts."""

    __tablename__ = "outcome_counts"

    subscription_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    minute: Mapped[dt.datetime] = mapped_column(DateTime, primary_key=True)  # the minute's start, UTC
    succeeded: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)  # attempts that failed, retried or not
    dead: Mapped[int] = mapped_column(Integer, default=0)  # deliveries given up on in that minute
    duration_ms: Mapped[int] = mapped_column(BigInteger, default=0)  # summed, for the average latency


class IncidentState:
    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"

    ALL = (OPEN, ACKNOWLEDGED, RESOLVED)


_UNRESOLVED = text("resolved_at IS NULL")
INCIDENT_NOTE_MAX = 500  # characters of an acknowledgement's note


class Incident(db.Model):
    """One outage, one incident: a subscription's (or, for `backlog`, Promesa's own: subscription_id is null),
    whatever the number of rules that fire for it; `rule` is the first, `rules` lists them all. It opens, may be
    acknowledged, and resolves by itself once every rule has been false for a whole window
    (dashboard.operations.incidents)."""

    __tablename__ = "incidents"
    __table_args__ = (
        # At most one unresolved incident per subscription, whoever evaluates and whichever rules fire: no storms.
        # coalesce: unique indexes treat NULLs as distinct, and `backlog` has no subscription.
        Index("uq_incidents_unresolved", text("coalesce(subscription_id, '')"), unique=True,
              postgresql_where=_UNRESOLVED, sqlite_where=_UNRESOLVED),
        Index("ix_incidents_opened_at", "opened_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("inc"))
    # No foreign keys: an incident is history, and outlives what it names (like the audit log).
    subscription_id: Mapped[str | None] = mapped_column(String(40))
    team_id: Mapped[int | None] = mapped_column(Integer)
    rule: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16), default=IncidentState.OPEN)
    opened_at: Mapped[dt.datetime] = mapped_column(DateTime)
    acknowledged_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    acknowledged_by: Mapped[str | None] = mapped_column(String(254))
    acknowledged_note: Mapped[str | None] = mapped_column(String(INCIDENT_NOTE_MAX))
    # No notifications about it until then (it still shows, and still resolves by itself).
    snoozed_until: Mapped[dt.datetime | None] = mapped_column(DateTime)
    snoozed_by: Mapped[str | None] = mapped_column(String(254))
    resolved_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    resolved_by: Mapped[str | None] = mapped_column(String(254))  # None: resolved by itself
    # When the evidence starts (the first dead letter, failure or waiting delivery), and when the rule
    # was last seen true: it resolves once last_seen_at is a whole window ago.
    first_seen_at: Mapped[dt.datetime] = mapped_column(DateTime)
    last_seen_at: Mapped[dt.datetime] = mapped_column(DateTime)
    # The figures that fired it, as of last_seen_at: {"dead": 7, "window_minutes": 15, "threshold": 5}.
    figures: Mapped[dict] = mapped_column(JSON, default=dict)
    # Every rule that fired during the outage: {rule: {"figures": {...}, "first_seen_at": iso, "last_seen_at": iso}}.
    rules: Mapped[dict | None] = mapped_column(JSON)


class IncidentRule(db.Model):
    """A subscription's own setting of one rule, where it differs from the defaults (owners and admins)."""

    __tablename__ = "incident_rules"

    subscription_id: Mapped[str] = mapped_column(ForeignKey("subscriptions.id"), primary_key=True)
    rule: Mapped[str] = mapped_column(String(32), primary_key=True)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    threshold: Mapped[float | None] = mapped_column(Float)
    window_minutes: Mapped[int | None] = mapped_column(Integer)
    min_attempts: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime)
    updated_by: Mapped[str] = mapped_column(String(254))


class SubscriptionHealth(db.Model):
    """What the sweeper folds, minute by minute, out of outcome_counts: running totals (for /metrics
    counters) and the current failure streak (for `failing_since` and automatic disable). Folding
    reads only the minutes since the last pass, so neither needs days of history at each pass."""

    __tablename__ = "subscription_health"

    subscription_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    succeeded_total: Mapped[int] = mapped_column(BigInteger, default=0)
    failed_total: Mapped[int] = mapped_column(BigInteger, default=0)
    dead_total: Mapped[int] = mapped_column(BigInteger, default=0)
    # The first failing minute with no success since (None: the last attempt that counted succeeded).
    failing_since: Mapped[dt.datetime | None] = mapped_column(DateTime)
    streak_failures: Mapped[int] = mapped_column(Integer, default=0)
    # When the streak had failed often enough to start the automatic-disable clock.
    disable_clock_started_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    last_failure_at: Mapped[dt.datetime | None] = mapped_column(DateTime)


class SweepMark(db.Model):
    """How far a sweeper task has got (a minute, a time, an attempt id), so the next pass reads only
    what is new. Advanced by a conditional UPDATE: of two sweepers, one folds a stretch, never both."""

    __tablename__ = "sweep_marks"

    name: Mapped[str] = mapped_column(String(40), primary_key=True)
    at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    position: Mapped[int | None] = mapped_column(BigInteger)


class MetricCounter(db.Model):
    """Counters that only grow, folded by the sweeper for /metrics (e.g. the attempt-latency histogram)."""

    __tablename__ = "metric_counters"

    name: Mapped[str] = mapped_column(String(60), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, default=0)


class NotificationSink(db.Model):
    """Where operational notifications go: a Slack-compatible incoming webhook or a JSON webhook.
    Each is a subscription of Promesa's own system team, so notifications are deliveries like any
    other: signed, retried, recorded, replayable."""

    __tablename__ = "notification_sinks"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("snk"))
    kind: Mapped[str] = mapped_column(String(16))  # "slack" or "json"
    name: Mapped[str] = mapped_column(String(100), default="", server_default="")
    # What it hears: these teams' notifications (None or empty: every team's, and Promesa's own), and these
    # kinds ("incident.opened", ...; None or empty: every kind).
    team_ids: Mapped[list | None] = mapped_column(JSON)
    kinds: Mapped[list | None] = mapped_column(JSON)
    subscription_id: Mapped[str] = mapped_column(ForeignKey("subscriptions.id"), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime)
    created_by: Mapped[str] = mapped_column(String(254))

    subscription: Mapped[Subscription] = relationship()


class OutcomeHour(db.Model):
    """outcome_counts summed per subscription per hour, for hours that are over (dashboard.stats.rollup):
    the overview's 24 h and a subscription's week read a few hundred of these instead of a hundred
    thousand minutes. A row with subscription_id "*" marks an hour as rolled up, busy or not."""

    __tablename__ = "outcome_hours"

    subscription_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    hour: Mapped[dt.datetime] = mapped_column(DateTime, primary_key=True)  # the hour's start, UTC
    succeeded: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    dead: Mapped[int] = mapped_column(Integer, default=0)
    duration_ms: Mapped[int] = mapped_column(BigInteger, default=0)


class ReplayState:
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"

    ACTIVE = (QUEUED, RUNNING)
    ENDED = (FINISHED, CANCELLED, FAILED)


class ReplayKind:
    REPLAY = "replay"  # re-send the dead letters
    DISCARD = "discard"  # end them discarded: never sent again
    # "replay since": a consumer's events since a time to one of its endpoints, missing deliveries made
    RECOVER = "recover"

    ALL = (REPLAY, DISCARD, RECOVER)
    SENDS = (REPLAY, RECOVER)  # the kinds whose deliveries go out, and whose outcomes are followed


_ACTIVE_REPLAY = text("state IN ('queued', 'running')")


class Replay(db.Model):
    """A bulk replay of dead letters: the filter it was asked for, carried out by an RQ job in chunks
    (dashboard.operations.replays). `done` counts deliveries re-queued so far; `succeeded` and `failed` are the
    outcomes the job last saw (the pages count them live from deliveries.replay_id)."""

    __tablename__ = "replays"
    __table_args__ = (
        # One queued or running replay per filter: a second click finds the first instead of a duplicate.
        Index("uq_replays_active_filter", "filter_key", unique=True, postgresql_where=_ACTIVE_REPLAY,
              sqlite_where=_ACTIVE_REPLAY),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("rpl"))
    kind: Mapped[str] = mapped_column(String(16), default=ReplayKind.REPLAY, server_default=ReplayKind.REPLAY)
    # Who asked, as in the audit log: ("user", email), ("token", prefix) or ("system", "system").
    actor_kind: Mapped[str] = mapped_column(String(10))
    actor: Mapped[str] = mapped_column(String(254))
    # The one team (or subscription) every matching delivery belongs to; None when it spans several.
    team_id: Mapped[int | None] = mapped_column(Integer)
    subscription_id: Mapped[str | None] = mapped_column(String(40))
    filter: Mapped[dict] = mapped_column(JSON)
    # SHA-256 of the filter's canonical JSON.
    filter_key: Mapped[str] = mapped_column(String(64))
    total: Mapped[int] = mapped_column(Integer, default=0)
    done: Mapped[int] = mapped_column(Integer, default=0)
    succeeded: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16), default=ReplayState.QUEUED)
    error: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, index=True)
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime)


class CheckState:
    RUNNING = "running"
    FINISHED = "finished"

    ALL = (RUNNING, FINISHED)


_RUNNING_CHECK = text("state = 'running'")


class Check(db.Model):
    """A receiver check of one subscription's endpoint (dashboard.subscriptions.checks): the rules of
    promesa_receiver.check, run as an RQ job. Its requests are no deliveries: no Delivery or Attempt
    row, so no count, chart, incident or dead letter ever sees them."""

    __tablename__ = "checks"
    __table_args__ = (
        Index("ix_checks_subscription_started", "subscription_id", "started_at"),
        # One running check per subscription, whoever clicks: a second one is refused, not queued.
        Index("uq_checks_running", "subscription_id", unique=True, postgresql_where=_RUNNING_CHECK,
              sqlite_where=_RUNNING_CHECK),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # chk_…, from promesa_receiver.check
    subscription_id: Mapped[str] = mapped_column(ForeignKey("subscriptions.id"))
    state: Mapped[str] = mapped_column(String(16), default=CheckState.RUNNING)
    started_at: Mapped[dt.datetime] = mapped_column(DateTime)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    # [{"rule", "passed": true | false | null, "detail", "advice"}], in promesa_receiver.check.RULES order.
    results: Mapped[list | None] = mapped_column(JSON)
    # Who asked, as in the audit log: an email, a token's display prefix, or "system".
    requested_by: Mapped[str] = mapped_column(String(254))
    # Why the job could not judge the endpoint at all (it crashed, or was abandoned), if so.
    error: Mapped[str | None] = mapped_column(String(500))
