"""What the producer API accepts and answers, as pydantic models.

Request models (subclasses of `Body`; `DeliveriesQuery` for a query string) are what the routes
validate with, and the OpenAPI document is generated from them (`dashboard/api/openapi.py`): a
limit written here is checked and documented at once. Response models only document; the routes build their JSON.
A constraint JSON Schema cannot say (the 8 KB cap on `data`, a URL that must resolve) is checked
by the service and answered with 413 or 422, never 400, so a request the document calls valid
is never refused as malformed.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

from .delivery.policies import POLICY_NAMES
from .models import DeliveryState, ReplayState, SubscriptionState
from .validation import (ID_PATTERN, MAX_VERSION, TYPE_PATTERN, Body, Must, TypeName, TypePattern, Version,
                         WholeNumber, keys_matching, text)

SIGNATURE_SCHEMES = ("promesa", "standard-webhooks")
MAX_BATCH = 500
MAX_EVENT_TYPES = 100  # patterns per subscription: each ingest matches every one of them
MAX_REPLAY_IDS = 1000
MAX_RATE_LIMIT_PER_S = 10_000
MAX_IN_FLIGHT = 64
MAX_GRACE_SECONDS = 7 * 86400
DELIVERY_ID_PATTERN = r"^[A-Za-z0-9_]{1,40}$"


# -- requests ------------------------------------------------------------------------------------

class EventInput(Body):
    type: TypeName
    version: Annotated[Version | None, Field(description="default: the latest declared version, else 1"),
                       Must(f"a whole number from 1 to {MAX_VERSION}")] = None
    timestamp: Annotated[AwareDatetime | None, Field(description="when it happened (default: when accepted)"),
                         Must("an RFC 3339 time with a zone, like 2026-11-29T18:00:00.123Z")] = None
    data: Annotated[dict[str, Any], Field(description="ids, versions and times only; at most 8 KB and 32 levels "
                                                      "deep; no NaN or Infinity"),
                    Must("a JSON object")] = {}
    id: Annotated[str | None, Field(pattern=ID_PATTERN, description="your stable id, unique in your team; "
                                                                    "repeating it returns the first event"),
                  Must("a string of at most 64 letters, digits, '_', '-', '.' or ':'")] = None

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"type": "file.updated", "data": {"resource_id": "f_123", "resource_version": 7}}]})


class EventBatch(Body):
    events: Annotated[list[EventInput], Field(min_length=1, max_length=MAX_BATCH),
                      Must(f"a list of 1 to {MAX_BATCH} events")]


class SubscriptionInput(Body):
    url: Annotated[str, Field(min_length=1, max_length=2048, pattern=r"^[Hh][Tt][Tt][Pp][Ss]?://[^\s\x00-\x1f\x7f]+$",
                              examples=["https://example.com/hooks"]),
                   Must("an http:// or https:// URL of at most 2048 characters")]
    event_types: Annotated[list[TypePattern], Field(min_length=1, max_length=MAX_EVENT_TYPES,
                                                    description="type names or fnmatch patterns such as 'file.*'"),
                           Must(f"a non-empty list of at most {MAX_EVENT_TYPES} type names or patterns "
                                "(letters, digits, '.', '_', '-' and '*'), like 'file.*'")] = ["*"]
    event_versions: Annotated[
        dict[Annotated[str, Field(pattern=TYPE_PATTERN)], Version],
        Field(max_length=MAX_EVENT_TYPES, json_schema_extra=keys_matching,
              description='pin a type to one version, e.g. {"file.updated": 2}; types not named arrive in every '
                          "version"),
        Must(f'an object mapping at most {MAX_EVENT_TYPES} event types to versions from 1 to {MAX_VERSION}, '
             'like {"file.updated": 2}')] = {}
    retry_policy: Annotated[Literal[POLICY_NAMES], Must(f"one of: {', '.join(POLICY_NAMES)}")] = "exponential"
    signature_scheme: Annotated[Literal[SIGNATURE_SCHEMES],
                                Must(f"one of: {', '.join(SIGNATURE_SCHEMES)}")] = "promesa"
    description: text(500) = ""
    connect_timeout: Annotated[float, Field(ge=0.1, le=5), Must("a number from 0.1 to 5")] = 5
    attempt_timeout: Annotated[float, Field(ge=0.1, le=10), Must("a number from 0.1 to 10")] = 10
    max_age_seconds: Annotated[int, Field(ge=60, le=7 * 86400), WholeNumber,
                               Must(f"a whole number from 60 to {7 * 86400}")] = 86400
    rate_limit_per_s: Annotated[float | None, Field(ge=0.01, le=MAX_RATE_LIMIT_PER_S,
                                                    description="deliveries per second to this endpoint across "
                                                                "all workers; null: no limit. A throttled delivery "
                                                                "waits its turn: not an attempt, not counted in "
                                                                "the retry schedule"),
                                Must(f"a number from 0.01 to {MAX_RATE_LIMIT_PER_S}, or null")] = None
    max_in_flight: Annotated[int | None, Field(ge=1, le=MAX_IN_FLIGHT,
                                               description="requests in flight to this endpoint per worker; "
                                                           "null: the installation's default"),
                             WholeNumber, Must(f"a whole number from 1 to {MAX_IN_FLIGHT}, or null")] = None

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"url": "https://example.com/hooks", "event_types": ["file.*"]}]})


def _edit_fields() -> dict:
    """SubscriptionInput's fields but the signature scheme (receivers verify by it), none required."""
    fields = {}
    for name, info in SubscriptionInput.model_fields.items():
        if name == "signature_scheme":
            continue
        if info.is_required():
            info = FieldInfo.merge_field_infos(info, default=None)  # given or not; never null when given
        fields[name] = (info.annotation, info)
    return fields


# PATCH /subscriptions/<id>: only the fields given change (model_fields_set); the audit log keeps before/after.
SubscriptionEdit = create_model("SubscriptionEdit", __base__=Body, **_edit_fields())


class RotateInput(Body):
    grace_seconds: Annotated[int, Field(ge=0, le=MAX_GRACE_SECONDS,
                                        description="how long the previous secret keeps signing; 0: not at all"),
                             WholeNumber, Must(f"a whole number from 0 to {MAX_GRACE_SECONDS} (7 days)")] = 86400


class ReplayInput(Body):
    delivery_ids: Annotated[list[Annotated[str, Field(pattern=DELIVERY_ID_PATTERN)]] | None,
                            Field(max_length=MAX_REPLAY_IDS,
                                  description="re-send these dead or succeeded deliveries (default: every dead one)"),
                            Must(f"a list of at most {MAX_REPLAY_IDS} delivery ids")] = None


class EventTypeInput(Body):
    name: TypeName
    version: Version = 1
    description: text(1000) = ""
    json_schema: Annotated[dict[str, Any], Field(alias="schema", description="JSON Schema of the event's data"),
                           Must("a JSON Schema object")]

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"name": "file.updated", "schema": {"type": "object", "properties": {"resource_id": {"type": "string"}}}}]})


class TeamUpdate(Body):
    strict_event_types: Annotated[bool | None, Field(description="accept declared event types only"),
                                  Must("true or false")] = None


class DeliveriesQuery(BaseModel):
    """Query strings are text: numbers arrive as "50", so this model converts (it is not strict)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    state: Annotated[Literal[DeliveryState.ALL] | None, Must(f"one of: {', '.join(DeliveryState.ALL)}")] = None
    limit: Annotated[int, Field(ge=1, le=100), Must("a whole number from 1 to 100")] = 50
    before: Annotated[str | None, Field(pattern=DELIVERY_ID_PATTERN,
                                        description="the next_before of the previous page"),
                      Must("a delivery id (the next_before of the previous page)")] = None


# -- responses (documentation) ---------------------------------------------------------------------

class Error(BaseModel):
    error: str = Field(description="what is wrong, naming the field")


class Accepted(BaseModel):
    id: str
    deliveries: int
    duplicate: bool


class AcceptedBatch(BaseModel):
    data: list[Accepted]


class Attempt(BaseModel):
    number: int
    attempted_at: str
    duration_ms: int
    status_code: int | None
    error: str | None
    response_excerpt: str | None


class Delivery(BaseModel):
    id: str
    event_id: str
    subscription_id: str
    state: Literal[DeliveryState.ALL]
    attempt_count: int
    next_attempt_at: str | None
    last_status_code: int | None
    last_error: str | None
    created_at: str
    succeeded_at: str | None
    dead_lettered_at: str | None


class DeliveryWithAttempts(Delivery):
    attempts: list[Attempt]


class DeliveryPage(BaseModel):
    data: list[Delivery]
    next_before: str | None


class Event(BaseModel):
    id: str
    type: str
    version: int
    timestamp: str
    data: dict[str, Any]
    deliveries: list[DeliveryWithAttempts]


class Subscription(BaseModel):
    id: str
    url: str
    description: str
    event_types: list[str]
    event_versions: dict[str, int]
    retry_policy: str
    signature_scheme: str
    state: Literal[SubscriptionState.ALL]
    state_reason: str | None
    connect_timeout: float
    attempt_timeout: float
    max_age_seconds: int
    rate_limit_per_s: float | None
    max_in_flight: int | None
    signing_secrets: list[SigningSecret] = Field(description="which secrets sign deliveries, and until when "
                                                             "(never their values)")
    created_at: str
    deleted_at: str | None = Field(description="set when deleted: nothing more is attempted")


class SigningSecret(BaseModel):
    which: Literal["current", "previous"]
    until: str | None = Field(description="the previous secret signs until its grace ends; null: until the next "
                                          "rotation")


class Deleted(Subscription):
    cancelled: int = Field(description="waiting deliveries that ended cancelled")


class TestSent(BaseModel):
    event_id: str
    delivery_id: str


class SubscriptionWithSecret(Subscription):
    secret: str = Field(description="whsec_...: shown in this answer only")


class Resumed(Subscription):
    released: int = Field(description="held deliveries now on their way")


class SubscriptionList(BaseModel):
    data: list[Subscription]


class Replayed(BaseModel):
    replayed: int


class Contract(BaseModel):
    """Guarantees, schedule, signature and verification code, generated from the live configuration."""

    model_config = ConfigDict(extra="allow")


class EventType(BaseModel):
    name: str
    version: int
    description: str
    json_schema: dict[str, Any] = Field(alias="schema")
    created_at: str


class EventTypeList(BaseModel):
    data: list[EventType]


class Team(BaseModel):
    name: str
    strict_event_types: bool


class OpenApiDocument(BaseModel):
    model_config = ConfigDict(extra="allow")



# -- bulk replays (dashboard.replays) ------------------------------------------------------------------

class BulkReplayInput(Body):
    since: Annotated[AwareDatetime | None, Field(description="only dead letters dead-lettered at or after this time"),
                     Must("an RFC 3339 time with a zone, like 2026-11-30T09:00:00Z")] = None
    until: Annotated[AwareDatetime | None, Field(description="only dead letters dead-lettered before this time"),
                     Must("an RFC 3339 time with a zone, like 2026-11-30T10:00:00Z")] = None
    event_types: Annotated[list[TypeName], Field(max_length=MAX_EVENT_TYPES, description="only these event types"),
                           Must(f"a list of at most {MAX_EVENT_TYPES} event type names")] = []


class ReplayStarted(BaseModel):
    id: str
    total: int = Field(description="dead letters matching when it was asked for")
    state: Literal[ReplayState.ACTIVE + ReplayState.ENDED]
    duplicate: bool = Field(description="true: the same replay was already queued or running; this is it")


class BulkReplay(BaseModel):
    id: str
    state: Literal[ReplayState.ACTIVE + ReplayState.ENDED]
    filter: dict[str, Any]
    subscription_id: str | None
    total: int = Field(description="dead letters matching when it was asked for")
    done: int = Field(description="re-queued so far")
    succeeded: int = Field(description="replayed deliveries delivered so far")
    failed: int = Field(description="replayed deliveries dead again")
    waiting: int = Field(description="replayed deliveries still on their way")
    error: str | None
    created_by: str
    created_at: str
    started_at: str | None
    finished_at: str | None
