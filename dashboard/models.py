"""The database is the source of truth: every event, delivery and attempt lives here.

Redis only ever holds ids of work to do (see `dashboard.queue`).
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
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship
from werkzeug.security import check_password_hash, generate_password_hash

from .clock import utcnow
from .extensions import db
from .ids import new_id

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a BIGINT.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class DeliveryState:
    PENDING = "pending"
    SCHEDULED = "scheduled"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    HELD = "held"

    ALL = (PENDING, SCHEDULED, SUCCEEDED, DEAD, HELD)
    # States a worker may pick up once next_attempt_at has come.
    DUE = (PENDING, SCHEDULED)


class SubscriptionState:
    ACTIVE = "active"
    PAUSED = "paused"
    DISABLED = "disabled"

    ALL = (ACTIVE, PAUSED, DISABLED)


class Team(db.Model):
    __tablename__ = "teams"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    # Strict: only event types declared in the catalog are accepted.
    strict_event_types: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)

    subscriptions: Mapped[list[Subscription]] = relationship(back_populates="team")


class User(UserMixin, db.Model):
    __tablename__ = "users"

    ROLES = ("admin", "operator", "owner", "member")

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    email: Mapped[str] = mapped_column(String(254), unique=True)
    password_hash: Mapped[str] = mapped_column(String(256))
    role: Mapped[str] = mapped_column(String(20), default="member")
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id"))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)

    team: Mapped[Team | None] = relationship()

    def set_password(self, password: str) -> None:
        self.password_hash = generate_password_hash(password)

    def check_password(self, password: str) -> bool:
        return check_password_hash(self.password_hash, password)


class ApiToken(db.Model):
    """A team's producer token. Only its SHA-256 is stored: the token is shown once."""

    __tablename__ = "api_tokens"
    PREFIX = "pk_"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    display_prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime)

    team: Mapped[Team] = relationship()

    @staticmethod
    def digest(token: str) -> str:
        return hashlib.sha256(token.encode("utf-8")).hexdigest()

    @classmethod
    def issue(cls, team: Team) -> tuple[ApiToken, str]:
        token = cls.PREFIX + secrets.token_urlsafe(32)
        return cls(team=team, token_sha256=cls.digest(token), display_prefix=token[:10]), token


class Subscription(db.Model):
    __tablename__ = "subscriptions"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("sub"))
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"), index=True)
    url: Mapped[str] = mapped_column(String(2048))
    description: Mapped[str] = mapped_column(String(500), default="")
    event_types: Mapped[list] = mapped_column(JSON, default=lambda: ["*"])
    # {"file.updated": 2}: receive only that version of that type; types not named arrive in every version.
    event_versions: Mapped[dict] = mapped_column(JSON, default=dict)
    retry_policy: Mapped[str] = mapped_column(String(32), default="exponential")
    signature_scheme: Mapped[str] = mapped_column(String(32), default="promesa")
    state: Mapped[str] = mapped_column(String(16), default=SubscriptionState.ACTIVE)
    state_reason: Mapped[str | None] = mapped_column(String(500))
    # Fernet ciphertext of the signing secret (see dashboard.crypto).
    secret_ciphertext: Mapped[str] = mapped_column(Text)
    connect_timeout: Mapped[float] = mapped_column(Float, default=5.0)
    attempt_timeout: Mapped[float] = mapped_column(Float, default=10.0)
    max_age_seconds: Mapped[int] = mapped_column(Integer, default=24 * 3600)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)

    team: Mapped[Team] = relationship(back_populates="subscriptions")


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
    __table_args__ = (UniqueConstraint("team_id", "idempotency_key", name="uq_events_team_idempotency_key"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"), index=True)
    type: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer, default=1)
    data: Mapped[dict] = mapped_column(JSON)
    # The exact body sent on every attempt, so id and timestamp never drift between retries.
    body: Mapped[str] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    occurred_at: Mapped[dt.datetime] = mapped_column(DateTime)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow, index=True)

    deliveries: Mapped[list[Delivery]] = relationship(back_populates="event", order_by="Delivery.created_at")


_HAS_NEXT_ATTEMPT = text("next_attempt_at IS NOT NULL")
_SUCCEEDED = text("state = 'succeeded'")
_DEAD = text("state = 'dead'")


class Delivery(db.Model):
    """One event promised to one subscription; its attempts say how the promise is going."""

    __tablename__ = "deliveries"
    __table_args__ = (
        # Only rows with a next attempt: settled deliveries (the history) stay out of the queue's index.
        Index("ix_deliveries_due", "state", "next_attempt_at", postgresql_where=_HAS_NEXT_ATTEMPT,
              sqlite_where=_HAS_NEXT_ATTEMPT),
        Index("ix_deliveries_subscription_state", "subscription_id", "state", "created_at"),
        # Retention's pruning finds the oldest settled rows of each kind without reading the rest.
        Index("ix_deliveries_succeeded", "succeeded_at", postgresql_where=_SUCCEEDED, sqlite_where=_SUCCEEDED),
        Index("ix_deliveries_dead", "dead_lettered_at", postgresql_where=_DEAD, sqlite_where=_DEAD),
        # Free room on each page, so a claim (lease columns only) is a heap-only update: no index entries.
        {"postgresql_with": {"fillfactor": 70}},
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("dlv"))
    event_id: Mapped[str] = mapped_column(ForeignKey("events.id"), index=True)
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

    event: Mapped[Event] = relationship(back_populates="deliveries")
    subscription: Mapped[Subscription] = relationship()
    attempts: Mapped[list[Attempt]] = relationship(order_by="Attempt.number", back_populates="delivery")


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

    delivery: Mapped[Delivery] = relationship(back_populates="attempts")
