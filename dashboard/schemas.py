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

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, RootModel, create_model
from promesa_receiver.check import ALL_RULES as CHECK_RULES
from pydantic.fields import FieldInfo

from dashboard.core import filters
from dashboard.core.validation import (
    ID_PATTERN,
    MAX_VERSION,
    TYPE_PATTERN,
    Body,
    Must,
    ProducerTypeName,
    TypeName,
    TypePattern,
    Version,
    WholeNumber,
    keys_matching,
    text,
)
from dashboard.models import (
    CONSUMER_UID_PATTERN,
    INCIDENT_NOTE_MAX,
    RETRY_POLICY_NAMES,
    CheckState,
    ConsumerState,
    DeliveryState,
    IncidentState,
    ReplayKind,
    ReplayState,
    SubscriptionMode,
    SubscriptionState,
)

SIGNATURE_SCHEMES = ("promesa", "standard-webhooks")
MAX_BATCH = 500
MAX_EVENT_TYPES = 100  # patterns per subscription: each ingest matches every one of them
MAX_REPLAY_IDS = 1000
MAX_RATE_LIMIT_PER_S = 10_000
MAX_IN_FLIGHT = 64
MAX_GRACE_SECONDS = 7 * 86400
DELIVERY_ID_PATTERN = r"^[A-Za-z0-9_]{1,40}$"
MAX_CONSUMER_METADATA_BYTES = 4096  # a consumer's metadata as compact JSON
CONSUMER_UID_WORDS = "a consumer uid: 1 to 100 letters, digits, '.', '_', ':' or '-'"
# A consumer's uid, as the producer chose it.
ConsumerUid = Annotated[str, Field(pattern=CONSUMER_UID_PATTERN, examples=["cus_8812"]), Must(CONSUMER_UID_WORDS)]


# -- requests ------------------------------------------------------------------------------------

FILTER_WORDS = (f"a payload filter (docs/api.md, Filters): dotted paths into the thin body (type, version, "
                f"data.region, ...) with a value, or operators $eq $ne $in $nin $gt $gte $lt $lte $exists, combined "
                f"with $and $or $not; at most {filters.MAX_CONDITIONS} conditions, {filters.MAX_DEPTH} levels and "
                f"{filters.MAX_FILTER_BYTES} bytes. Of the events of its types, only those it admits get a "
                f"delivery; a filter that is wrong is a 422 naming where")
# What the document can say of a filter: an object. Its language is checked by filters.compile (422).
PayloadFilter = Annotated[dict[str, Any], Field(examples=[{"data.region": "eu"}]), Must("a JSON object (a filter)")]

class EventInput(Body):
    type: ProducerTypeName
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
    consumer: Annotated[str | None, Field(pattern=CONSUMER_UID_PATTERN,
                                          description="the uid of the consumer it is for: only that consumer's "
                                                      "subscriptions receive it. Absent: the team's subscriptions "
                                                      "that belong to no consumer"),
                        Must(CONSUMER_UID_WORDS)] = None

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"type": "file.updated", "data": {"resource_id": "f_123", "resource_version": 7}},
        {"type": "invoice.paid", "consumer": "cus_8812", "data": {"resource_id": "in_77", "resource_version": 1}}]})


class EventBatch(Body):
    events: Annotated[list[EventInput], Field(min_length=1, max_length=MAX_BATCH),
                      Must(f"a list of 1 to {MAX_BATCH} events")]


# A receiver's own headers (dashboard.subscriptions.own_headers checks the rest: refused names, 4 KB in all).
HEADER_NAME_PATTERN = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$"  # an RFC 9110 token
HEADER_VALUE_PATTERN = r"^[\x21-\x7e](?:[\x20-\x7e]{0,4094}[\x21-\x7e])?$"  # printable ASCII, no CR, LF or NUL
MAX_OWN_HEADERS = 10
HeaderName = Annotated[str, Field(pattern=HEADER_NAME_PATTERN)]
HeaderValue = Annotated[str, Field(pattern=HEADER_VALUE_PATTERN, max_length=4096)]
_HEADERS_WORDS = (f"an object of at most {MAX_OWN_HEADERS} headers, like {{\"X-Api-Key\": \"…\"}}: names are RFC 9110 "
                  "tokens (letters, digits and !#$%&'*+-.^_`|~), values printable ASCII without CR, LF or NUL, "
                  "not starting or ending with a space (a masked value, as reads show it, is not a value)")
_HEADERS_ABOUT = ("the receiver's own headers, sent with every attempt, test event and receiver check (an API key "
                  "its gateway demands); values are credentials: encrypted at rest, and reads show them masked. "
                  "Not Host, Content-Length, Content-Type, Transfer-Encoding, Connection, User-Agent, X-Signature, "
                  "webhook-*, X-Promesa-* nor a header Promesa sets (X-Event-Id ...): 422. At most 4096 bytes "
                  "of names and values together: 422")


# A client certificate for mutual TLS (dashboard.subscriptions.client_tls checks that it parses, that the key is
# the certificate's and that it is in date: 422).
MAX_PEM_CHARACTERS = 65536
_PEM_WORDS = f"PEM text of at most {MAX_PEM_CHARACTERS} characters"


class ClientTlsInput(Body):
    """A client certificate Promesa presents on every HTTPS delivery, test event and receiver check."""
    client_certificate: Annotated[str, Field(min_length=1, max_length=MAX_PEM_CHARACTERS,
                                             description="the client certificate (PEM), possibly followed by its "
                                                         "chain; in date now, else 422"),
                                  Must(_PEM_WORDS)]
    client_key: Annotated[str, Field(min_length=1, max_length=MAX_PEM_CHARACTERS,
                                     description="its private key (PEM, unencrypted: an encrypted key is a 422); "
                                                 "encrypted at rest, never shown again"),
                          Must(_PEM_WORDS)]
    ca_certificates: Annotated[str | None, Field(min_length=1, max_length=MAX_PEM_CHARACTERS,
                                                 description="certificate authorities (PEM) trusted for the "
                                                             "receiver's certificate besides the system's: for a "
                                                             "receiver with a private CA"),
                               Must(_PEM_WORDS + ", or null")] = None


_TLS_ABOUT = ("mutual TLS: a client certificate presented on every HTTPS delivery, test event and receiver check, "
              "and CA certificates trusted besides the system's. The key must be the certificate's and the "
              "certificate in date (422). Reads show its subject, issuer and expiry, never the key")

# A receiver's OAuth2 client credentials (dashboard.subscriptions.client_auth checks the token URL as an endpoint's).
URL_PATTERN = r"^[Hh][Tt][Tt][Pp][Ss]?://[^\s\x00-\x1f\x7f-\x9f\ufeff]+$"
PRINTABLE_PATTERN = r"^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$"  # visible ASCII, inner spaces; no CR, LF or NUL
_PRINTABLE_WORDS = "printable ASCII without CR, LF or NUL, not starting or ending with a space"
_AUTH_ABOUT = ("OAuth2 client credentials: Promesa gets a bearer token from token_url (under the endpoint URL's "
               "rules and timeouts), keeps it until shortly before it expires, and sends Authorization: Bearer with "
               "every attempt, test event and receiver check. The client secret is encrypted at rest and reads show "
               "it masked")


class ClientCredentialsInput(Body):
    type: Annotated[Literal["oauth2_client_credentials"], Must("oauth2_client_credentials")]
    token_url: Annotated[str, Field(min_length=1, max_length=2048, pattern=URL_PATTERN,
                                    examples=["https://auth.example.com/oauth/token"]),
                         Must("an http:// or https:// URL of at most 2048 characters")]
    client_id: Annotated[str, Field(max_length=256, pattern=PRINTABLE_PATTERN),
                         Must(f"1 to 256 characters, {_PRINTABLE_WORDS}")]
    client_secret: Annotated[str, Field(max_length=1024, pattern=PRINTABLE_PATTERN, repr=False,
                                        description="never shown again (a masked value, as reads show it, is not "
                                                    "a value)"),
                             Must(f"1 to 1024 characters, {_PRINTABLE_WORDS}")]
    scope: Annotated[str | None, Field(max_length=1024, pattern=PRINTABLE_PATTERN,
                                       description="sent as the token request's scope, when given"),
                     Must(f"at most 1024 characters, {_PRINTABLE_WORDS}, or null")] = None
    audience: Annotated[str | None, Field(max_length=2048, pattern=PRINTABLE_PATTERN,
                                          description="sent as the token request's audience, when given"),
                        Must(f"at most 2048 characters, {_PRINTABLE_WORDS}, or null")] = None

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"type": "oauth2_client_credentials", "token_url": "https://auth.example.com/oauth/token",
         "client_id": "promesa", "client_secret": "…", "scope": "webhooks:write"}]})


class ClientCredentialsEdit(ClientCredentialsInput):
    """An edit's auth: without client_secret, the stored one is kept while token_url and client_id stay."""
    client_secret: Annotated[str | None, Field(max_length=1024, pattern=PRINTABLE_PATTERN, repr=False,
                                               description="absent or null: keep the stored one (only while "
                                                           "token_url and client_id stay as they are)"),
                             Must(f"1 to 1024 characters, {_PRINTABLE_WORDS}, or left out to keep it")] = None


class SubscriptionInput(Body):
    # Required for push, refused for pull (dashboard.delivery.pull.refuse_push_settings): a 422 that says so.
    url: Annotated[str, Field(min_length=1, max_length=2048, pattern=URL_PATTERN,
                              examples=["https://example.com/hooks"],
                              description="where deliveries are POSTed; required for push, absent for pull"),
                   Must("an http:// or https:// URL of at most 2048 characters")] = None
    mode: Annotated[Literal[SubscriptionMode.ALL],
                    Field(description="push: POSTed to `url`; pull: no URL, its receiver fetches deliveries with "
                                      "GET /subscriptions/{id}/pull and answers with POST .../pull/ack. Cannot "
                                      "change later"),
                    Must(f"one of: {', '.join(SubscriptionMode.ALL)}")] = SubscriptionMode.PUSH
    listen: Annotated[bool, Field(description="true (pull only): a listen session, the temporary subscription "
                                              "`promesa-receiver listen` makes for itself. Each pull marks it "
                                              "seen; the sweeper deletes it once idle for "
                                              "PROMESA_LISTEN_IDLE_SECONDS (600 by default). Cannot change "
                                              "later"),
                      Must("true or false")] = False
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
    retry_policy: Annotated[Literal[RETRY_POLICY_NAMES], Must(f"one of: {', '.join(RETRY_POLICY_NAMES)}")] = "exponential"
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
    check: Annotated[bool, Field(description="true: run the receiver check on the new endpoint at once (the answer's "
                                             "check_id names it; GET /checks/{check_id} gives the report). The "
                                             "receiver cannot know the secret before this answer shows it, so "
                                             "the signed requests of such an early check are likely refused: "
                                             "run it again once the receiver holds the secret"),
                     Must("true or false")] = False
    headers: Annotated[dict[HeaderName, HeaderValue], Field(max_length=MAX_OWN_HEADERS,
                                                            json_schema_extra=keys_matching,
                                                            description=_HEADERS_ABOUT),
                       Must(_HEADERS_WORDS)] = {}
    auth: Annotated[ClientCredentialsInput | None, Field(description=_AUTH_ABOUT + "; null: none")] = None
    consumer: Annotated[str | None, Field(pattern=CONSUMER_UID_PATTERN,
                                          description="the uid of the consumer whose endpoint this is: it receives "
                                                      "only events addressed to that consumer. Absent: the team's own "
                                                      "endpoint, for unaddressed events"),
                        Must(CONSUMER_UID_WORDS)] = None
    filter: Annotated[PayloadFilter | None, Field(description=f"{FILTER_WORDS}; null: every event of its types")] = None
    tls: Annotated[ClientTlsInput | None, Field(description=f"{_TLS_ABOUT}; null: none (on PATCH: remove it; a "
                                                            "new object replaces the whole setting)")] = None

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"url": "https://example.com/hooks", "event_types": ["file.*"]},
        {"url": "https://example.com/hooks", "event_types": ["invoice.*"],
         "filter": {"data.region": "eu", "data.amount": {"$gte": 100}}}]})


def _edit_fields() -> dict:
    """SubscriptionInput's fields but the signature scheme (receivers verify by it), none required."""
    fields = {}
    for name, info in SubscriptionInput.model_fields.items():
        # The check is run on request, never edited; an endpoint never moves to another consumer.
        if name in ("signature_scheme", "check", "consumer", "mode", "listen"):
            continue
        if info.is_required():
            info = FieldInfo.merge_field_infos(info, default=None)  # given or not; never null when given
        fields[name] = (info.annotation, info)
    fields["headers"] = _headers_patch()
    fields["auth"] = (ClientCredentialsEdit | None, Field(None, description=_AUTH_ABOUT + "; null removes them"))
    return fields


class _HeadersPatch(Body):
    """An edit's headers merge into the stored ones (JSON Merge Patch): a value sets or replaces one, null
    removes one, a name left out keeps its value; null for the whole object removes them all."""
    headers: Annotated[
        Annotated[dict[HeaderName, HeaderValue | None],
                  Field(max_length=2 * MAX_OWN_HEADERS, json_schema_extra=keys_matching)] | None,
        Field(description="merged into the stored headers: a value sets or replaces one, null removes one, a name "
                          "left out keeps its value (never shown again); null for the whole object removes them "
                          "all. Values " + _HEADERS_ABOUT.split("; values ", 1)[1]),
        Must(_HEADERS_WORDS + "; null removes one, or, for the whole object, all")] = None


def _headers_patch() -> tuple:
    info = _HeadersPatch.model_fields["headers"]
    return info.annotation, info


# PATCH /subscriptions/<id>: only the fields given change (model_fields_set); the audit log keeps before/after.
SubscriptionEdit = create_model("SubscriptionEdit", __base__=Body, **_edit_fields())


class RotateInput(Body):
    grace_seconds: Annotated[int, Field(ge=0, le=MAX_GRACE_SECONDS,
                                        description="how long the previous secret keeps signing; 0: not at all"),
                             WholeNumber, Must(f"a whole number from 0 to {MAX_GRACE_SECONDS} (7 days)")] = 86400


class PauseInput(Body):
    reason: text(500, description="why, shown on the subscription's page and kept in the audit log") = ""


class ReplayInput(Body):
    delivery_ids: Annotated[list[Annotated[str, Field(pattern=DELIVERY_ID_PATTERN)]] | None,
                            Field(max_length=MAX_REPLAY_IDS,
                                  description="re-send these dead or succeeded deliveries (default: every dead one)"),
                            Must(f"a list of at most {MAX_REPLAY_IDS} delivery ids")] = None


class EventTypeInput(Body):
    name: ProducerTypeName
    version: Version = 1
    description: text(1000) = ""
    json_schema: Annotated[dict[str, Any], Field(alias="schema", description="JSON Schema of the event's data"),
                           Must("a JSON Schema object")]

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"name": "file.updated", "schema": {"type": "object", "properties": {"resource_id": {"type": "string"}}}}]})


class FilterTestInput(Body):
    filter: Annotated[PayloadFilter, Field(description=FILTER_WORDS)]
    event: Annotated[dict[str, Any], Field(description="an event as receivers get it (the thin body: id, type, "
                                                       "version, timestamp, data)"),
                     Must("a JSON object (an event's body)")]

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"filter": {"data.region": "eu"},
         "event": {"type": "invoice.paid", "version": 1, "data": {"resource_id": "in_77", "region": "eu"}}}]})


class TeamUpdate(Body):
    strict_event_types: Annotated[bool | None, Field(description="accept declared event types only"),
                                  Must("true or false")] = None


class ConsumerInput(Body):
    """PUT /consumers/{uid}: the fields given replace the stored ones; absent ones keep theirs (a new one: empty)."""
    name: Annotated[str | None, Field(max_length=200, description="shown on the dashboard (default: the uid)"),
                    Must("a string of at most 200 characters")] = None
    metadata: Annotated[dict[str, Any] | None,
                        Field(description=f"a JSON object of your own, at most {MAX_CONSUMER_METADATA_BYTES} bytes "
                                          "as compact JSON"),
                        Must("a JSON object, or null")] = None
    state: Annotated[Literal[ConsumerState.ALL] | None,
                     Field(description="disabled: its deliveries are held, as for a paused subscription, until it is "
                                       "active again"),
                     Must(f"one of: {', '.join(ConsumerState.ALL)}")] = None

    model_config = ConfigDict(json_schema_extra={"examples": [{"name": "Acme Corp", "metadata": {"plan": "pro"}}]})


class PortalLinkInput(Body):
    """POST /consumers/{uid}/portal-links: how long the link (and the session it opens) lasts."""
    expires_in: Annotated[int, Field(ge=60, le=604800, description="seconds, from 60 to 604,800 (7 days)"),
                          WholeNumber, Must("a whole number of seconds from 60 to 604800 (7 days)")] = 3600


class PortalLink(BaseModel):
    url: str = Field(description="signs one browser in to the consumer's portal, once; shown only in this answer")
    expires_at: str = Field(description="when the link, and the session it opens, end")


class PortalSessionsRevoked(BaseModel):
    revoked: int = Field(description="open sessions and unused links of the consumer that are now ended")


class PortalSettingsInput(Body):
    """PUT /portal-settings: the fields given replace the stored ones."""
    frame_ancestors: Annotated[list[str] | None,
                               Field(max_length=10, description="origins (https://app.example.com) whose pages may "
                                                                "show the portal in an iframe; none by default"),
                               Must("a list of at most 10 origins")] = None
    accent_color: Annotated[str | None, Field(description="#rrggbb, for the portal's buttons and links"),
                            Must("a colour as #rrggbb, or null")] = None
    logo_url: Annotated[str | None, Field(description="an https URL of an image shown at the top of the portal"),
                        Must("an https URL, or null")] = None


class PortalSettings(BaseModel):
    frame_ancestors: list[str]
    accent_color: str | None
    logo_url: str | None


class ConsumersQuery(BaseModel):
    """A page of the team's consumers, by uid."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    prefix: Annotated[str | None,
                      Field(pattern=r"^[A-Za-z0-9._:-]{0,100}$", description="only uids starting with this"),
                      Must("the start of a consumer uid: up to 100 letters, digits, '.', '_', ':' or '-'")] = None
    limit: Annotated[int, Field(ge=1, le=100), Must("a whole number from 1 to 100")] = 50
    after: Annotated[str | None, Field(pattern=CONSUMER_UID_PATTERN, description="the next_after of the previous page"),
                     Must("a consumer uid (the next_after of the previous page)")] = None


class DeliveriesQuery(BaseModel):
    """Query strings are text: numbers arrive as "50", so this model converts (it is not strict)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    state: Annotated[Literal[DeliveryState.ALL] | None, Must(f"one of: {', '.join(DeliveryState.ALL)}")] = None
    limit: Annotated[int, Field(ge=1, le=100), Must("a whole number from 1 to 100")] = 50
    before: Annotated[str | None, Field(pattern=DELIVERY_ID_PATTERN,
                                        description="the next_before of the previous page"),
                      Must("a delivery id (the next_before of the previous page)")] = None


class SubscriptionsQuery(BaseModel):
    """A page of the team's subscriptions, oldest first (ids are time-ordered)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    limit: Annotated[int, Field(ge=1, le=100), Must("a whole number from 1 to 100")] = 50
    after: Annotated[str | None, Field(pattern=DELIVERY_ID_PATTERN, description="the next_after of the previous page"),
                     Must("a subscription id (the next_after of the previous page)")] = None


class EventTypesQuery(BaseModel):
    """A page of the team's catalog, in the order it was declared."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    limit: Annotated[int, Field(ge=1, le=100), Must("a whole number from 1 to 100")] = 50
    after: Annotated[str | None, Field(pattern=r"^[0-9]{1,9}$", description="the next_after of the previous page"),
                     Must("the next_after of the previous page")] = None


class IncidentsQuery(BaseModel):
    """A page of the team's incidents, newest first (ids are time-ordered)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    state: Annotated[Literal[IncidentState.ALL] | None, Must(f"one of: {', '.join(IncidentState.ALL)}")] = None
    limit: Annotated[int, Field(ge=1, le=100), Must("a whole number from 1 to 100")] = 50
    before: Annotated[str | None,
                      Field(pattern=DELIVERY_ID_PATTERN, description="the next_before of the previous page"),
                      Must("an incident id (the next_before of the previous page)")] = None


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
    consumer: str | None = Field(description="the uid of the consumer it was addressed to; null: none")
    deliveries: list[DeliveryWithAttempts]


class ClientCertificate(BaseModel):
    """What may be shown of a subscription's client certificate."""
    subject: str = Field(description="its subject, as RFC 4514 writes it")
    issuer: str = Field(description="its issuer, as RFC 4514 writes it")
    expires_at: str = Field(description="when it ends (not valid after)")
    ca_certificates: bool = Field(description="CA certificates are trusted for the receiver besides the system's")


class ClientCredentials(BaseModel):
    type: Literal["oauth2_client_credentials"]
    token_url: str
    client_id: str
    client_secret: str = Field(description="always \"••••\": never shown again")
    scope: str | None
    audience: str | None


class Subscription(BaseModel):
    id: str
    url: str | None = Field(description="where deliveries are POSTed; null for a pull subscription")
    mode: Literal[SubscriptionMode.ALL] = Field(description="push, or pull: fetched by its receiver")
    pull_key_prefix: str | None = Field(None, description="a pull subscription's key, by its first characters")
    listen: bool = Field(description="a listen session of `promesa-receiver listen` (pull): temporary, deleted "
                                     "by the sweeper once idle")
    listen_seen_at: str | None = Field(description="a listen session's last pull (written at most every few "
                                                   "seconds); null for any other subscription")
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
    headers: dict[str, str] = Field(default={}, description="the receiver's own headers: names only, every value "
                                                          "shown as \"••••\" (never their values)")
    auth: ClientCredentials | None = Field(None, description="its OAuth2 client credentials, the secret shown as "
                                                            "\"••••\"; null: none")
    consumer: str | None = Field(description="the uid of the consumer whose endpoint this is; null: the team's own")
    filter: dict[str, Any] | None = Field(description="its payload filter; null: every event of its types")
    tls: ClientCertificate | None = Field(default=None, description="its client certificate for mutual TLS (never "
                                                                     "the key); null: none")
    created_at: str
    deleted_at: str | None = Field(description="set when deleted: nothing more is attempted")


class Consumer(BaseModel):
    uid: str
    name: str
    metadata: dict[str, Any] | None
    state: Literal[ConsumerState.ALL]
    subscriptions: int = Field(description="its endpoints (not deleted)")
    created_at: str
    updated_at: str
    deleted_at: str | None = Field(description="set when deleted: out of routing; what was accepted is still delivered")


class DeletedConsumer(Consumer):
    released: int = Field(description="held deliveries now on their way: deleting holds back nothing accepted")


class ConsumerList(BaseModel):
    data: list[Consumer]
    next_after: str | None


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


class CreatedSubscription(SubscriptionWithSecret):
    check_id: str | None = Field(None, description='the receiver check started by "check": true, if asked for')
    pull_key: str | None = Field(None, description="a pull subscription's own key (shown this once): it pulls and "
                                                   "acks this subscription and nothing else")


class Resumed(Subscription):
    released: int = Field(description="held deliveries now on their way")


class SubscriptionList(BaseModel):
    data: list[Subscription]
    next_after: str | None


class FilterTested(BaseModel):
    matches: bool = Field(description="whether the event passes the filter")


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
    next_after: str | None


class QuotaUse(BaseModel):
    limit: int = Field(description="the team's value: its own (set by an admin) or the default")
    default: int
    overridden: bool = Field(description="an admin set this team's own value")
    used: int | None = Field(description="how much of it the team uses now, where that is a count")
    description: str


class Quotas(BaseModel):
    """What one team may take of Promesa (dashboard.ingest.quotas)."""
    subscriptions: QuotaUse = Field(description="the team's own subscriptions (of no consumer); past it, creating "
                                                "one answers 409")
    consumers: QuotaUse = Field(description="consumers per team; past it, creating one answers 409")
    subscriptions_per_consumer: QuotaUse = Field(description="subscriptions of one consumer; past it, creating one "
                                                             "answers 409")
    events_per_second: QuotaUse = Field(description="events accepted per second, a batch counting as its "
                                                    "events; past it, 429 with Retry-After")
    queued_deliveries: QuotaUse = Field(description="owed deliveries (pending, scheduled, held, dead); past it, "
                                                    "ingest answers 429 with Retry-After")
    test_event_seconds: QuotaUse = Field(description="seconds between two test events to one subscription; "
                                                     "sooner, 429 with Retry-After")
    event_types: QuotaUse = Field(description="event types (names) in the catalog; past it, declaring a new one "
                                              "answers 409")
    event_type_versions: QuotaUse = Field(description="versions of one event type (used: the most of any type); "
                                                      "past it, 409")
    catalog_bytes: QuotaUse = Field(description="schemas and descriptions as stored; past it, a declaration answers "
                                                "413")
    declarations_per_minute: QuotaUse = Field(description="event-type declarations a minute, refused ones too; past "
                                                          "it, 429 with Retry-After")


class Team(BaseModel):
    name: str
    strict_event_types: bool
    quotas: Quotas


class QuotaError(BaseModel):
    error: str = Field(description="what was refused, and why")
    quota: str = Field(description="the quota it is past: subscriptions, events_per_second, queued_deliveries, "
                                   "test_event_seconds")
    limit: int = Field(description="the team's value of that quota")
    retry_after_seconds: int | None = Field(None, description="as the Retry-After header says")


class OpenApiDocument(BaseModel):
    model_config = ConfigDict(extra="allow")



# -- bulk replays (dashboard.operations.replays) ------------------------------------------------------------------

class BulkReplayInput(Body):
    since: Annotated[AwareDatetime | None, Field(description="only dead letters dead-lettered at or after this time"),
                     Must("an RFC 3339 time with a zone, like 2026-11-30T09:00:00Z")] = None
    until: Annotated[AwareDatetime | None, Field(description="only dead letters dead-lettered before this time"),
                     Must("an RFC 3339 time with a zone, like 2026-11-30T10:00:00Z")] = None
    event_types: Annotated[list[TypeName], Field(max_length=MAX_EVENT_TYPES, description="only these event types"),
                           Must(f"a list of at most {MAX_EVENT_TYPES} event type names")] = []


class RecoverInput(Body):
    subscription_id: Annotated[str, Field(pattern=DELIVERY_ID_PATTERN, description="the consumer's endpoint to send "
                                          "them to (one of its subscriptions)"),
                               Must("the id of one of the consumer's subscriptions")]
    since: Annotated[AwareDatetime, Field(description="the consumer's events accepted at or after this time"),
                     Must("an RFC 3339 time with a zone, like 2026-11-30T09:00:00Z")]


MAX_SELECTED_DEAD_LETTERS = 500  # dead letters one bulk job may name (dashboard.operations.replays)


class DiscardInput(BulkReplayInput):
    delivery_ids: Annotated[list[Annotated[str, Field(pattern=DELIVERY_ID_PATTERN)]],
                            Field(max_length=MAX_SELECTED_DEAD_LETTERS,
                                  description="only these dead letters (default: every one the filter matches)"),
                            Must(f"a list of at most {MAX_SELECTED_DEAD_LETTERS} delivery ids")] = []


class GiveUpInput(Body):
    delivery_ids: Annotated[list[Annotated[str, Field(pattern=DELIVERY_ID_PATTERN)]] | None,
                            Field(max_length=MAX_REPLAY_IDS,
                                  description="give up on these scheduled deliveries (default: every scheduled one)"),
                            Must(f"a list of at most {MAX_REPLAY_IDS} delivery ids")] = None


class GivenUp(BaseModel):
    given_up: int = Field(description="scheduled deliveries that are dead letters now")


class ReplayStarted(BaseModel):
    id: str
    total: int = Field(description="dead letters matching when it was asked for")
    state: Literal[ReplayState.ACTIVE + ReplayState.ENDED]
    duplicate: bool = Field(description="true: the same replay was already queued or running; this is it")
    held_until_resume: bool = Field(False, description="true: the subscription is paused or disabled, so what is "
                                                       "replayed is held until it is resumed or enabled, not sent")


class BulkReplay(BaseModel):
    id: str
    kind: Literal[ReplayKind.ALL] = Field(description="replay: re-send the dead letters; discard: end them discarded; "
                                          "recover: a consumer's events since a time to one of its endpoints")
    state: Literal[ReplayState.ACTIVE + ReplayState.ENDED] = Field(description="the job's: finished means all of it "
                                                                   "re-queued (or discarded)")
    progress: str = Field(description="what it means for the deliveries: the state, or, for a finished replay, "
                                      "'sending' or 'held until resume' until all of it was sent")
    filter: dict[str, Any]
    subscription_id: str | None
    total: int = Field(description="dead letters matching when it was asked for")
    done: int = Field(description="re-queued so far")
    succeeded: int = Field(description="replayed deliveries delivered so far")
    failed: int = Field(description="replayed deliveries dead again")
    waiting: int = Field(description="replayed deliveries still on their way (held ones apart)")
    held: int = Field(description="replayed deliveries held until their paused or disabled subscription resumes")
    sent: int = Field(description="replayed deliveries that reached their receiver: delivered or dead again")
    discarded: int = Field(description="a discard's: dead letters discarded so far")
    error: str | None
    created_by: str
    created_at: str
    started_at: str | None
    finished_at: str | None


# -- receiver checks and diagnosis (dashboard.subscriptions.checks, .diagnosis) -------------------------------------

class CheckStarted(BaseModel):
    id: str = Field(description="chk_…: GET /checks/{id} gives its report")


class CheckResult(BaseModel):
    rule: Literal[CHECK_RULES]
    passed: bool | None = Field(description="null: the rule could not be judged (the detail says why)")
    detail: str
    advice: str = Field(description="what to change; empty unless the rule failed")
    status: int | None = Field(None, description="the HTTP status of the answer the rule was judged on "
                                                 "(null: no answer, or a rule judged on none)")
    excerpt: str | None = Field(None, description="the start of that answer's body, control characters escaped")


class Check(BaseModel):
    id: str
    subscription_id: str
    state: Literal[CheckState.ALL]
    started_at: str
    finished_at: str | None
    results: list[CheckResult] = Field(description="one per rule once finished; empty while running")
    requested_by: str
    error: str | None = Field(description="why the check could not run at all, if so")


class DiagnosisGroup(BaseModel):
    cause: str
    label: str
    count: int
    last_at: str | None
    example: str = Field(description="the newest such attempt's status code or error")
    status_codes: list[int]
    advice: str


class Diagnosis(BaseModel):
    subscription_id: str
    consumer: str | None = Field(None, description="the uid of the consumer whose endpoint it is; null for the "
                                                   "team's own endpoint")
    consumer_disabled: bool = Field(False, description="true: its consumer is disabled, so its deliveries are held "
                                                       "and nothing is sent until it is enabled")
    since: str
    attempts: int = Field(description="attempts read (the window's newest, at most 2000)")
    failures: int
    p95_ms: int | None = Field(description="95th percentile of the answer times in the window")
    timeout_limit_seconds: float
    groups: list[DiagnosisGroup] = Field(description="failures by cause, most frequent first")


class AcknowledgeInput(Body):
    note: text(INCIDENT_NOTE_MAX, description="what you are doing about it, for the sinks and the incident's page") = ""


class SnoozeInput(Body):
    until: Annotated[AwareDatetime, Field(description="no notifications about it until then: at most 7 days ahead"),
                     Must("an RFC 3339 time with a zone, like 2026-11-30T18:00:00Z")]


class Incident(BaseModel):
    id: str
    subscription_id: str | None = Field(description="null: Promesa's own health (the backlog)")
    consumer: str | None = Field(None, description="the uid of the consumer whose endpoint it is about; null for "
                                                   "the team's own endpoint")
    state: Literal[IncidentState.ALL]
    title: str = Field(description="what the first rule that fired says")
    rules: list[str] = Field(description="every rule that fired during the outage, the first first")
    figures: list[str] = Field(description="the figures that fired it, in words")
    opened_at: str
    first_seen_at: str = Field(description="when the evidence starts: the first dead letter, failure or wait")
    acknowledged_at: str | None
    acknowledged_by: str | None
    note: str | None = Field(description="the acknowledgement's note")
    snoozed_until: str | None
    resolved_at: str | None
    resolved_by: str | None = Field(description="null when it resolved by itself")
    url: str = Field(description="its page on the dashboard")


class IncidentList(BaseModel):
    data: list[Incident]
    next_before: str | None


# -- pull delivery (dashboard.delivery.pull) ---------------------------------------------------------

MAX_PULL = 100
LEASE_SECONDS = (5, 300)
MAX_PULL_WAIT = 25


class PullQuery(BaseModel):
    """Query strings are text: numbers arrive as "10", so this model converts (it is not strict)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    limit: Annotated[int, Field(ge=1, le=MAX_PULL, description="at most this many deliveries"),
                     Must(f"a whole number from 1 to {MAX_PULL}")] = 10
    lease: Annotated[int, Field(ge=LEASE_SECONDS[0], le=LEASE_SECONDS[1],
                                description="seconds the deliveries handed out are yours to ack: no other client "
                                            "gets them meanwhile; one not acked by then counts as a failed attempt"),
                     Must(f"a whole number of seconds from {LEASE_SECONDS[0]} to {LEASE_SECONDS[1]}")] = 30
    wait: Annotated[int, Field(ge=0, le=MAX_PULL_WAIT,
                               description="seconds to wait for a delivery when none is due (long polling): the "
                                           "answer comes as soon as one is, or empty when the time is up"),
                    Must(f"a whole number of seconds from 0 to {MAX_PULL_WAIT}")] = 0


class PullKey(BaseModel):
    pull_key: str = Field(description="pulls and acks this subscription and nothing else; shown this once")
    pull_key_prefix: str = Field(description="its first characters, to tell it by")


class PulledDelivery(BaseModel):
    delivery_id: str
    attempt: int = Field(description="this attempt's number (1 the first time; a lease that ran out counts)")
    body: str = Field(description="the exact body a push would POST: verify the signature over these characters")
    headers: dict[str, str] = Field(description="the headers a push would carry (X-Signature or webhook-*, "
                                                "X-Event-Id, ...): verify with them as a receiver of a push does")


class PulledList(BaseModel):
    data: list[PulledDelivery] = Field(description="due deliveries now leased to you, oldest due first; empty: "
                                                   "nothing is due (or the subscription or its consumer is paused "
                                                   "or disabled)")


class AckEntry(Body):
    delivery_id: Annotated[str, Field(pattern=DELIVERY_ID_PATTERN), Must("a delivery id handed out by a pull")]
    attempt: Annotated[int, Field(ge=1, le=1_000_000, description="the attempt as the pull handed it out: it names the "
                                                                  "lease this ack answers"),
                       WholeNumber, Must("the attempt number the pull handed out (a whole number from 1)")]
    status: Annotated[int | None, Field(ge=200, le=599, description="what handling it came to, as an HTTP status: "
                                                                    "2xx settles it; anything else, or null (it "
                                                                    "could not be handled), is a failed attempt "
                                                                    "retried by the subscription's retry policy"),
                      WholeNumber, Must("an HTTP status from 200 to 599, or null")]
    error: text(500, description="why it failed, in words: recorded with the attempt") = ""


class AckInput(RootModel[Annotated[list[AckEntry], Field(min_length=1, max_length=MAX_PULL)]]):
    """[{"delivery_id", "status", "error"?}, ...]: one entry per delivery handled."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, frozen=True)


class AckResult(BaseModel):
    delivery_id: str
    status: Literal[200, 404, 409] = Field(description="200: recorded; 409: its lease has run out or passed to "
                                                       "another client (nothing was recorded: the delivery goes on "
                                                       "without this answer); 404: no such delivery of this "
                                                       "subscription")
    state: Literal[DeliveryState.ALL] | None = Field(description="the delivery's state after the ack (200 only)")
    next_attempt_at: str | None = Field(description="when it is due again, if it was scheduled")
    error: str | None = Field(description="why it was refused (409 and 404)")


class AckResults(BaseModel):
    data: list[AckResult] = Field(description="one per entry, in the order sent")
