"""The Promesa receiver SDK: what an application receiving Promesa webhooks imports.

Standard library only at import time (no Flask, SQLAlchemy or Redis); the SQL-backed
helpers import SQLAlchemy when you build them, ``RedisClaims`` only uses the client you pass.

1. Verify the signature over the raw body bytes, before anything else::

       from promesa_receiver import verify, verify_standard, VerificationError

       try:
           verify(request_body_bytes, headers.get("X-Signature"), [SECRET, OLD_SECRET])
           # or, for a Standard Webhooks subscription:
           # verify_standard(request_body_bytes, headers, [SECRET])
       except VerificationError as exc:
           return 400, str(exc)       # says which check failed; never contains a secret

2. Process each event id once (``SqlClaims`` / ``RedisClaims``). A duplicate delivery
   MUST be answered 2xx (200 or 204): a 4xx/5xx makes Promesa retry it again and again
   and finally dead-letter an event you already handled.

3. For state that must not go backwards, let ``ResourceOrdering`` decide per event whether
   to apply it (duplicate / stale / apply); see ``promesa_receiver.ordering`` for the rule.
   Stale events are answered 2xx as well.

4. On a consumer's endpoint, ``consumer_of(headers)`` is the uid of the consumer the delivery is for
   (``X-Promesa-Consumer``; not signed, so read it after verifying): check that the endpoint it arrived
   at belongs to that customer of yours.
"""

from .signing import CONSUMER_HEADER, PROMESA_HEADER
from .claims import RedisClaims, SqlClaims
from .errors import (
    InvalidEvent,
    MalformedSignature,
    MissingSignature,
    SignatureMismatch,
    TimestampOutsideTolerance,
    VerificationError,
)
from .ordering import (
    Action,
    Decision,
    InMemoryOrderingStore,
    Mark,
    OrderingStore,
    ReceivedEvent,
    ResourceOrdering,
    SqlOrderingStore,
    StoredEvent,
    is_newer,
    parse_event,
)
from .verify import (
    DEFAULT_TOLERANCE,
    consumer_of,
    parse_promesa_header,
    parse_standard_signatures,
    verify,
    verify_standard,
)

__all__ = [
    "PROMESA_HEADER",
    "CONSUMER_HEADER",
    "DEFAULT_TOLERANCE",
    "verify",
    "verify_standard",
    "consumer_of",
    "parse_promesa_header",
    "parse_standard_signatures",
    "VerificationError",
    "MissingSignature",
    "MalformedSignature",
    "TimestampOutsideTolerance",
    "SignatureMismatch",
    "InvalidEvent",
    "SqlClaims",
    "RedisClaims",
    "ResourceOrdering",
    "Decision",
    "Action",
    "Mark",
    "ReceivedEvent",
    "StoredEvent",
    "OrderingStore",
    "InMemoryOrderingStore",
    "SqlOrderingStore",
    "is_newer",
    "parse_event",
]
