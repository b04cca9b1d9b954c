"""`Client`: publish events to a Promesa service so that none is lost on the way.

Each event gets its id before the first try, so a retry (or a flush of the spool) after a lost
answer finds the first copy instead of storing a second one."""

from __future__ import annotations

import email.utils
import http.client
import json
import random
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

from .errors import PromesaError, Rejected, Unavailable
from .spool import Spool

MAX_BATCH = 500  # the service's limit of events per batch request
MAX_BATCH_BYTES = 900 * 1024  # under the service's default 1 MiB body limit, with room for the envelope
# "Not now" answers (a restarting service, a proxy, a limit); any other status is the answer, however often asked.
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
EVENT_FIELDS = frozenset({"type", "data", "id", "version", "timestamp", "consumer"})


def _user_agent() -> str:
    """promesa-producer/<its version>, read from the installed distribution (pyproject.toml says it once)."""
    try:
        return f"promesa-producer/{metadata.version('promesa-producer')}"
    except metadata.PackageNotFoundError:  # the module copied into an application instead of installed
        return "promesa-producer"


USER_AGENT = _user_agent()


def new_id() -> str:
    """An event id the service accepts (at most 64 of letters, digits, '_', '-', '.', ':'), unique by chance."""
    return f"pub_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Published:
    """What became of one event: accepted (`deliveries` planned; `duplicate` if its id was already
    stored), or `spooled` (kept in the local spool; `deliveries` is None until a flush sends it)."""
    id: str
    deliveries: int | None
    duplicate: bool = False
    spooled: bool = False


@dataclass(frozen=True)
class Consumer:
    """A consumer as the service holds it after `put_consumer`: `created` is True when this call made it."""
    uid: str
    name: str
    metadata: dict | None
    state: str
    subscriptions: int
    created: bool


@dataclass(frozen=True)
class PortalLink:
    """A link into the consumer's portal: hand `url` to that consumer alone (it signs one browser in, once);
    it and the session it opens end at `expires_at` (ISO 8601, UTC)."""
    url: str
    expires_at: str


@dataclass
class Flushed:
    """What one `flush()` did: events accepted, and events the service refused for good (kept in the
    spool's `rejected()` list with their reason, never sent again)."""
    published: list[Published] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a POST turned into a GET would lose the event: answer the 3xx instead


class Client:
    """A producer's connection to one Promesa service (`url`: its base, e.g. https://promesa.example.com).

    `retries`: tries after the first one for an answer that may change (429, 503, other 5xx but 501
    and 505, 408, connection errors, timeouts), waiting `backoff * 2**n` seconds at most (full
    jitter, capped by `max_backoff`), or exactly what `Retry-After` says (up to `max_retry_after`;
    a longer wait ends the retries). `spool`: a SQLite file path; when given, an event that could
    not be handed over is kept there and `publish` returns it with `spooled=True` instead of raising.
    `sleep`, `clock` (unix seconds) and `rng` are injectable, for tests."""

    def __init__(self, url: str, token: str, *, timeout: float = 10.0, retries: int = 5, backoff: float = 0.5,
                 max_backoff: float = 30.0, max_retry_after: float = 120.0, spool=None,
                 max_batch: int = MAX_BATCH, max_batch_bytes: int = MAX_BATCH_BYTES,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, user_agent: str = USER_AGENT):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"url must be an http:// or https:// URL, not {url!r}")
        if not token or any(c in token for c in "\r\n"):
            raise ValueError("token must be a team API token")
        if retries < 0 or max_batch < 1:
            raise ValueError("retries must be 0 or more, and max_batch 1 or more")
        self.url = url.rstrip("/")
        self._token = token
        self.timeout, self.retries, self.backoff, self.max_backoff = timeout, retries, backoff, max_backoff
        self.max_retry_after = max_retry_after
        self.max_batch, self.max_batch_bytes = max_batch, max_batch_bytes
        self.sleep, self.clock, self.rng = sleep, clock, rng or random.Random()
        self.user_agent = user_agent
        self.spool = Spool(spool, clock=clock) if spool is not None else None
        self._opener = urllib.request.build_opener(_NoRedirects)

    def __repr__(self) -> str:
        return f"Client({self.url!r}, token=<hidden>)"  # the token never shows in a log or a traceback

    # -- publishing ------------------------------------------------------------------------------

    def publish(self, type: str, data: Mapping[str, Any] | None = None, id: str | None = None, *,
                version: int | None = None, timestamp: datetime | str | None = None,
                consumer: str | None = None) -> Published:
        """Publish one event; `consumer`: the uid of the consumer it is for (only its subscriptions receive it).
        Raises `Rejected` (or `AuthError`) for an answer that will not change (an unknown consumer uid: 422),
        and `Unavailable` after the retries unless a spool keeps the event (then `spooled=True`)."""
        event = _event({"type": type, "data": data, "id": id, "version": version, "timestamp": timestamp,
                        "consumer": consumer})
        try:
            answer = self._post("/api/v1/events", event)
        except Unavailable as exc:
            if self.spool is None:
                exc.ids = [event["id"]]
                raise
            self.spool.add([self._dated(event)])
            return Published(event["id"], None, spooled=True)
        return Published(answer["id"], answer["deliveries"], answer["duplicate"])

    def publish_many(self, events: Iterable[Mapping[str, Any]]) -> list[Published]:
        """Publish events (mappings of type, data, id, version, timestamp, consumer) in batches within the
        service's limits, in order; one `Published` per event, in the order given.

        A refused batch raises `Rejected` with `index` naming the event in `events`; the batches before
        it are stored (`exc.published`). Unreachable: the rest is spooled, or `Unavailable` is raised."""
        prepared = [_event(e) for e in events]
        published: list[Published] = []
        for offset, chunk in self._chunks(prepared):
            try:
                published += self._post_batch(chunk, offset)
            except Unavailable as exc:
                rest = prepared[offset:]
                if self.spool is None:
                    exc.published, exc.ids = published, [e["id"] for e in rest]
                    raise
                self.spool.add([self._dated(e) for e in rest])
                return published + [Published(e["id"], None, spooled=True) for e in rest]
            except PromesaError as exc:
                exc.published = published
                raise
        return published

    def put_consumer(self, uid: str, *, name: str | None = None, metadata: Mapping[str, Any] | None = None,
                     state: str | None = None) -> Consumer:
        """Create the consumer `uid` (your own id for your customer), or update the fields given (None: left as
        they are); idempotent, so safe to call before each first publish to it. `state`: "active" or
        "disabled" (its deliveries held). Raises `Rejected` (a uid outside the rule, a quota: 409) or
        `Unavailable`, as `publish` does; nothing is spooled."""
        if not isinstance(uid, str) or not uid:
            raise TypeError("a consumer needs a uid (a non-empty string)")
        body = {k: v for k, v in (("name", name), ("state", state)) if v is not None}
        if metadata is not None:
            body["metadata"] = dict(metadata)
        status, answer = self._send("PUT", "/api/v1/consumers/" + urllib.parse.quote(uid, safe=""), body)
        return Consumer(answer["uid"], answer["name"], answer["metadata"], answer["state"], answer["subscriptions"],
                        created=status == 201)

    def portal_link(self, uid: str, *, expires_in: int = 3600) -> PortalLink:
        """A new link into consumer `uid`'s portal, where it manages its own endpoints (docs/portal.md).
        `expires_in`: 60 seconds to 7 days. A retry after a lost answer makes a second link; the first, never
        handed out, expires unused. Raises `Rejected` (no such consumer: 404; a disabled one: 409)."""
        status, answer = self._send("POST", f"/api/v1/consumers/{urllib.parse.quote(uid, safe='')}/portal-links",
                                    {"expires_in": expires_in})
        return PortalLink(answer["url"], answer["expires_at"])

    def revoke_portal_sessions(self, uid: str) -> int:
        """End every portal session and unused link of consumer `uid`; how many were ended."""
        status, answer = self._send("DELETE",
                                    f"/api/v1/consumers/{urllib.parse.quote(uid, safe='')}/portal-sessions", {})
        return answer["revoked"]

    def flush(self) -> Flushed:
        """Send the spooled events, oldest first, deleting each only after the service accepted it.

        Raises `Unavailable` (the rest stays spooled; what was sent is in `exc.published`) or
        `AuthError` (nothing more is sent). An event refused for good moves to `spool.rejected()`."""
        if self.spool is None:
            return Flushed()
        done = Flushed()
        while rows := self.spool.claim(self.max_batch):
            try:
                for _, chunk in self._chunks(rows, lambda row: row.event):
                    if not self._flush_chunk(chunk, done):
                        break  # rows went back unsent: claim again, so the oldest still go first
                self.spool.release([row.seq for row in rows])  # the rest of this claim, if the loop broke
            except PromesaError as exc:
                self.spool.release([row.seq for row in rows])
                exc.published = done.published
                raise
        return done

    def _flush_chunk(self, rows, done: Flushed) -> bool:
        """Send one batch of claimed rows; False when some of them were released unsent."""
        try:
            accepted = self._post_batch([row.event for row in rows])
        except Rejected as exc:
            if exc.status in (401, 403):
                raise
            # One event spoils its batch: keep the one named, or find it by sending one at a time.
            for i, row in enumerate(rows):
                if exc.index is not None and i != exc.index:
                    self.spool.release([row.seq])
                    continue
                try:
                    done.published += self._post_batch([row.event])
                    self.spool.remove([row.seq])
                except Rejected as alone:
                    if alone.status in (401, 403):
                        raise
                    self.spool.reject(row.seq, alone.error)
                    done.rejected.append(alone)
            return exc.index is None
        self.spool.remove([row.seq for row in rows])
        done.published += accepted
        return True

    # -- the wire --------------------------------------------------------------------------------

    def _post_batch(self, events: list[dict], offset: int = 0) -> list[Published]:
        answer = self._post("/api/v1/events/batch", {"events": events}, offset=offset, batch=True)
        return [Published(a["id"], a["deliveries"], a["duplicate"]) for a in answer["data"]]

    def _chunks(self, items: list, event_of: Callable = lambda e: e):
        """(offset, items) within max_batch events and max_batch_bytes of JSON each."""
        start, size, chunk = 0, 0, []
        for i, item in enumerate(items):
            length = len(_json(event_of(item))) + 1
            if chunk and (len(chunk) >= self.max_batch or size + length > self.max_batch_bytes):
                yield start, chunk
                start, size, chunk = i, 0, []
            chunk.append(item)
            size += length
        if chunk:
            yield start, chunk

    def _post(self, path: str, body: dict, *, offset: int = 0, batch: bool = False) -> dict:
        return self._send("POST", path, body, offset=offset, batch=batch)[1]

    def _send(self, method: str, path: str, body: dict, *, offset: int = 0, batch: bool = False) -> tuple[int, dict]:
        """(status, answer) of the first 2xx, retrying what may change; PUT is idempotent, so retried too."""
        payload = _json(body)
        attempt = 0
        while True:
            attempt += 1
            retry_after = None
            try:
                status, headers, answer = self._request(method, path, payload)
            except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
                status, cause = None, _describe(exc)
            else:
                if 200 <= status < 300:
                    return status, answer
                error = answer.get("error") if isinstance(answer, dict) else None
                error = error if isinstance(error, str) else f"HTTP {status}"
                # A batch's 409 is two requests storing the same id at once: sending again answers duplicates.
                if status not in RETRY_STATUSES and not (batch and status == 409):
                    raise Rejected.from_answer(status, error, offset)
                cause = f"{status}: {error}"
                retry_after = _retry_after(headers.get("Retry-After"), self.clock())
            if attempt > self.retries:
                raise Unavailable(f"gave up after {attempt} tries: {cause}", attempts=attempt, status=status,
                                  cause=cause)
            if retry_after is not None and retry_after > self.max_retry_after:
                raise Unavailable(f"the service asks to wait {retry_after:.0f} s, more than max_retry_after: "
                                  f"{cause}", attempts=attempt, status=status, cause=cause)
            if retry_after is None:
                retry_after = self.rng.uniform(0, min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))
            self.sleep(retry_after)

    def _request(self, method: str, path: str, payload: bytes) -> tuple[int, Mapping[str, str], Any]:
        request = urllib.request.Request(self.url + path, data=payload, method=method, headers={
            "Authorization": f"Bearer {self._token}", "Content-Type": "application/json",
            "Accept": "application/json", "User-Agent": self.user_agent})
        try:
            with self._opener.open(request, timeout=self.timeout) as resp:
                status, headers, raw = resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as err:
            with err:
                status, headers, raw = err.code, err.headers, err.read()
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {}  # a proxy's HTML page: the status code alone decides
        if 200 <= status < 300 and not isinstance(answer, dict):
            raise http.client.HTTPException(f"a {status} answer without a JSON object")
        return status, headers, answer

    def _dated(self, event: dict) -> dict:
        """The event as it is spooled: with the time it was published, not the time a flush sends it."""
        if "timestamp" in event:
            return event
        at = datetime.fromtimestamp(self.clock(), UTC)
        return {**event, "timestamp": at.isoformat(timespec="milliseconds").replace("+00:00", "Z")}


def _event(given: Mapping[str, Any]) -> dict:
    """The event's JSON object, with an id made now if it had none; absent fields are left to the service."""
    unknown = set(given) - EVENT_FIELDS
    if unknown:
        raise ValueError(f"unknown event fields: {', '.join(sorted(unknown))}")
    if not isinstance(given.get("type"), str):
        raise TypeError("an event needs a type (a string)")
    event = {k: v for k, v in given.items() if v is not None}
    event["id"] = event.get("id") or new_id()
    if isinstance(event.get("timestamp"), datetime):
        if event["timestamp"].tzinfo is None:
            raise ValueError("timestamp must carry a time zone")
        event["timestamp"] = event["timestamp"].isoformat()
    if "data" in event:
        event["data"] = dict(event["data"])
    return event


def _json(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def _retry_after(value: str | None, now: float) -> float | None:
    """Retry-After in seconds from now: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - now)
    except (TypeError, ValueError, IndexError):
        return None


def _describe(exc: BaseException) -> str:
    """The error itself, not urllib's wrapper: 'ConnectionRefusedError: [Errno 111] Connection refused'."""
    reason = getattr(exc, "reason", None) if isinstance(exc, urllib.error.URLError) else None
    cause = reason if isinstance(reason, BaseException) else exc
    return f"{type(cause).__name__}: {cause}"
