"""``promesa-receiver listen``: a developer's app on this machine gets its events without a public URL.

The command makes a temporary pull subscription on Promesa (a *listen session*, ``"listen": true``) and
prints its signing secret once, or attaches to an existing pull subscription (``--subscription``). Then it
pulls, forwards each delivery to ``--forward-to`` as a POST with the exact body and the delivery's headers
(the signature among them, so the app verifies what production would), and acks each with the app's answer:
its status, or null and why when the app could not be reached or did not answer in time. One line per
delivery says what happened. Ctrl-C (or SIGTERM) ends it and deletes the temporary subscription; one that
dies without ending is deleted by Promesa's sweeper once idle.

It is this command that connects to the app, never Promesa: the forward target must be a loopback address
or one of this machine's, checked once at the start and kept (a name that resolves elsewhere later is not
followed). Standard library only.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import signal
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

from .check import TIMEOUT_SECONDS, Answer

__all__ = ["DEFAULT_URL", "ForwardTarget", "Promesa", "PromesaError", "forward", "forward_target", "listen"]

DEFAULT_URL = "http://127.0.0.1:5000"
TOKEN_VARIABLE = "PROMESA_TOKEN"
# Deliveries per pull; each is forwarded in turn within TIMEOUT_SECONDS (Promesa's own limit for a push),
# so the lease covers a whole batch against an app that times out on every one.
PULL_LIMIT = 10
LEASE_SECONDS = PULL_LIMIT * int(TIMEOUT_SECONDS) + 30
# Long polling: the pull waits up to this long for a delivery. A server that answers at once instead (one
# without long polling) is asked again after EMPTY_PAUSE_SECONDS, never in a busy loop.
WAIT_SECONDS = 25
EMPTY_PAUSE_SECONDS = 0.75
# A request to Promesa: the longest pull wait and then some.
API_TIMEOUT_SECONDS = WAIT_SECONDS + 15
# While Promesa cannot be reached (restarting, say), the loop tries again after these pauses, the last repeated.
RETRY_PAUSES = (1, 2, 4, 8, 15)
# An ack's error text (Promesa keeps 500 characters) and what is read of the app's answer for it.
ERROR_CHARS = 500
EXCERPT_BYTES = 4096
# Promesa's answers that end the command: what the token may not do, or what does not exist.
_FINAL = {400, 401, 403, 404, 409, 413, 415, 422, 429}


class PromesaError(Exception):
    """Promesa refused a request (``status``, its message), or could not be reached (``status`` None)."""

    def __init__(self, status: int | None, message: str):
        super().__init__(message)
        self.status = status
        self.message = message

    def __str__(self) -> str:
        return f"Promesa answered {self.status}: {self.message}" if self.status else self.message

    @property
    def final(self) -> bool:
        return self.status in _FINAL


# -- the forward target ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ForwardTarget:
    """Where deliveries go: the URL as given, and the addresses its host had when it was checked."""

    url: str
    scheme: str
    host: str
    port: int
    path: str
    addresses: tuple[str, ...]


def forward_target(url: str) -> ForwardTarget:
    """The URL checked: http(s), and every address its host resolves to is loopback or this machine's.
    Raises ValueError saying what is wrong."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("--forward-to must be an http:// or https:// URL of your app, like "
                         "http://127.0.0.1:8000/webhooks")
    if parts.username is not None or parts.password is not None:
        raise ValueError("--forward-to takes no user:password@ (your app verifies the signature instead)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError("--forward-to: the port must be a number from 1 to 65535") from None
    try:
        found = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ValueError(f"--forward-to: {parts.hostname} does not resolve to an address ({exc})") from None
    addresses = tuple(dict.fromkeys(info[4][0] for info in found))
    elsewhere = [address for address in addresses if not _this_machine(address)]
    if elsewhere:
        named = elsewhere[0] if parts.hostname == elsewhere[0] else f"{parts.hostname} ({elsewhere[0]})"
        raise ValueError(f"--forward-to must be an app on this machine: {named} is neither a loopback address "
                         "nor one of this machine's. listen forwards to your own app only (Promesa never connects "
                         "to it); for an endpoint elsewhere, make a push subscription instead")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return ForwardTarget(url, parts.scheme, parts.hostname, port, path, addresses)


def _this_machine(address: str) -> bool:
    """Loopback, or an address this machine holds (binding a socket to it succeeds only then)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip.is_loopback:
        return True
    if ip.is_unspecified or ip.is_multicast:
        return False
    with socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


class _Pinned(http.client.HTTPConnection):
    """A connection to the addresses checked at the start, whatever the host's name resolves to now."""

    def __init__(self, target: ForwardTarget, timeout: float):
        super().__init__(target.host, target.port, timeout=timeout)
        self.addresses = target.addresses

    def connect(self):
        self.sock = _connect(self.addresses, self.port, self.timeout)


class _PinnedTls(http.client.HTTPSConnection):
    """The same over TLS, the certificate checked against the host's name."""

    def __init__(self, target: ForwardTarget, timeout: float):
        self.tls = ssl.create_default_context()
        super().__init__(target.host, target.port, timeout=timeout, context=self.tls)
        self.addresses = target.addresses

    def connect(self):
        self.sock = self.tls.wrap_socket(_connect(self.addresses, self.port, self.timeout), server_hostname=self.host)


def _connect(addresses: Sequence[str], port: int, timeout: float) -> socket.socket:
    """The first of the addresses that accepts (localhost may be ::1 and 127.0.0.1, the app on one of them)."""
    error: OSError | None = None
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout)
        except OSError as exc:
            error = exc
    raise error or OSError("no address to connect to")


def forward(target: ForwardTarget, body: bytes, headers: dict[str, str],
            timeout: float = TIMEOUT_SECONDS) -> Answer:
    """POST the delivery to the app: never a redirect followed, never raises for a failed request (an
    ``Answer`` without status says why); ``timeout`` bounds the whole answer."""
    connection = (_PinnedTls if target.scheme == "https" else _Pinned)(target, timeout)
    started = time.monotonic()
    try:
        connection.request("POST", target.path, body=body, headers=headers)
        response = connection.getresponse()
        received = response.read(EXCERPT_BYTES)
    except (OSError, http.client.HTTPException) as exc:
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return Answer(None, time.monotonic() - started, error=f"{target.url}: {reason}",
                      timed_out=isinstance(exc, TimeoutError))
    finally:
        connection.close()
    elapsed = time.monotonic() - started
    if elapsed > timeout:
        return Answer(None, elapsed, error=f"{target.url}: no answer within {timeout:g} s", timed_out=True)
    return Answer(response.status, elapsed, location=response.getheader("Location"),
                  excerpt=received.decode("utf-8", errors="replace"))


# -- Promesa's API ---------------------------------------------------------------------------------
class Promesa:
    """The few API calls listen makes, with a team's token; a refusal raises ``PromesaError`` with the
    API's own message."""

    def __init__(self, base_url: str, token: str):
        self.base_url = base_url.rstrip("/")
        self.token = token

    def call(self, method: str, path: str, body=None, timeout: float = API_TIMEOUT_SECONDS):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Accept": "application/json",
            **({"Content-Type": "application/json"} if data is not None else {})})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as refused:
            raise PromesaError(refused.code, _message(refused)) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PromesaError(None, f"could not reach Promesa at {self.base_url}: {reason}") from None

    def create(self, event_types: list[str], consumer: str | None, description: str) -> dict:
        body = {"mode": "pull", "listen": True, "event_types": event_types, "description": description}
        return self.call("POST", "/api/v1/subscriptions", body | ({"consumer": consumer} if consumer else {}))

    def subscription(self, subscription_id: str) -> dict:
        return self.call("GET", f"/api/v1/subscriptions/{_quoted(subscription_id)}")

    def pull(self, subscription_id: str) -> list[dict]:
        query = urllib.parse.urlencode({"limit": PULL_LIMIT, "wait": WAIT_SECONDS, "lease": LEASE_SECONDS})
        return self.call("GET", f"/api/v1/subscriptions/{_quoted(subscription_id)}/pull?{query}")["data"]

    def ack(self, subscription_id: str, entries: list[dict]) -> list[dict]:
        return self.call("POST", f"/api/v1/subscriptions/{_quoted(subscription_id)}/pull/ack", entries)["data"]

    def delete(self, subscription_id: str) -> dict:
        return self.call("DELETE", f"/api/v1/subscriptions/{_quoted(subscription_id)}")


def _quoted(subscription_id: str) -> str:
    return urllib.parse.quote(subscription_id, safe="")


def _message(refused: urllib.error.HTTPError) -> str:
    """The API's ``{"error": ...}``, or the start of whatever else came back."""
    raw = refused.read(EXCERPT_BYTES)
    try:
        return str(json.loads(raw)["error"])
    except (ValueError, KeyError, TypeError):
        return raw.decode("utf-8", errors="replace").strip()[:200] or refused.reason


# -- the session -----------------------------------------------------------------------------------
class _Stopped(Exception):
    """Raised by the signal handler into a pull, a pause or a forward: the session is ending."""


class _Session:
    """One run of the command: pulls, forwards, acks and prints until stopped."""

    def __init__(self, promesa: Promesa, target: ForwardTarget, subscription_id: str, out: TextIO, colour: bool):
        self.promesa, self.target, self.subscription_id = promesa, target, subscription_id
        self.out, self.colour = out, colour
        self.stop_requested = False
        self.interruptible = False

    def stop(self, signum, frame) -> None:
        self.stop_requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C ends even the clean-up
        if self.interruptible:
            raise _Stopped

    @contextmanager
    def _interruptible(self):
        """A stop raises here at once (a long pull, a pause, a forward to a slow app) instead of after it."""
        self.interruptible = True
        try:
            if self.stop_requested:
                raise _Stopped
            yield
        finally:
            self.interruptible = False

    def run(self) -> None:
        """Until stopped; a refusal from Promesa (``PromesaError.final``) ends it by raising."""
        failures = 0
        while not self.stop_requested:
            try:
                asked = time.monotonic()
                with self._interruptible():
                    items = self.promesa.pull(self.subscription_id)
                if items:
                    self._forward_and_ack(items)
                elif time.monotonic() - asked < 1:
                    with self._interruptible():
                        time.sleep(EMPTY_PAUSE_SECONDS)
                failures = 0
            except _Stopped:
                return
            except PromesaError as exc:
                if exc.final and exc.status != 429:  # a pull refused for now (too many waiting) is asked again
                    raise
                pause = RETRY_PAUSES[min(failures, len(RETRY_PAUSES) - 1)]
                failures += 1
                print(f"{exc}; trying again in {pause} s", file=self.out, flush=True)
                try:
                    with self._interruptible():
                        time.sleep(pause)
                except _Stopped:
                    return

    def _forward_and_ack(self, items: list[dict]) -> None:
        """Forward each in turn and ack them together; after a stop, the rest are acked as not forwarded."""
        entries = []
        for item in items:
            if self.stop_requested:
                entries.append(_entry(item, None, "listen ended before forwarding it"))
                continue
            try:
                with self._interruptible():
                    answer = forward(self.target, item["body"].encode("utf-8"), item["headers"])
            except _Stopped:
                entries.append(_entry(item, None, "listen ended while forwarding it"))
                continue
            entries.append(_entry(item, answer.status, _ack_error(answer)))
            self._print(item, answer)
        for result in self.promesa.ack(self.subscription_id, entries):
            if result["status"] != 200:  # its lease ran out meanwhile: Promesa goes on without this answer
                print(f"  ack of {result['delivery_id']} refused: {result['error']}", file=self.out, flush=True)

    def _print(self, item: dict, answer: Answer) -> None:
        headers = {name.lower(): value for name, value in item["headers"].items()}
        ok = answer.status is not None and 200 <= answer.status < 300
        said = str(answer.status) if answer.status is not None else "failed"
        if self.colour:
            said = f"\033[{32 if ok else 31}m{said}\033[0m"
        line = (f"{time.strftime('%H:%M:%S')}  {headers.get('x-event-type', '?')}  {headers.get('x-event-id', '?')}  "
                f"{said}  {round(answer.elapsed * 1000)} ms")
        print(line + (f"  {answer.error}" if answer.error else ""), file=self.out, flush=True)


def _entry(item: dict, status: int | None, error: str | None) -> dict:
    return {"delivery_id": item["delivery_id"], "attempt": item["attempt"], "status": status,
            **({"error": error} if error else {})}


def _ack_error(answer: Answer) -> str | None:
    """What the ack says beside the status: why there is none, or the start of a failure's answer."""
    if answer.status is None:
        text = answer.error or "no answer"
    elif 200 <= answer.status < 300:
        return None
    else:
        text = answer.excerpt or ""
    return text.replace("\x00", "")[:ERROR_CHARS] or None


# -- the command -----------------------------------------------------------------------------------
def listen(promesa: Promesa, target: ForwardTarget, *, event_types: Sequence[str] = ("*",),
           consumer: str | None = None, subscription_id: str | None = None, out: TextIO = sys.stdout,
           colour: bool | None = None) -> int:
    """Run a listen session until SIGINT or SIGTERM. Returns the exit status: 0 ended cleanly, 1 Promesa
    refused (its message printed), 130 interrupted again while ending."""
    if colour is None:
        colour = out.isatty() and "NO_COLOR" not in os.environ
    temporary = subscription_id is None
    try:
        subscription_id = _begin(promesa, target, list(event_types), consumer, subscription_id, out)
    except PromesaError as exc:
        print(f"promesa-receiver listen: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # before it began: a session just made is left to Promesa's idle clean-up
        print("promesa-receiver listen: interrupted", file=sys.stderr)
        return 130
    session = _Session(promesa, target, subscription_id, out, colour)
    handlers = {signum: signal.signal(signum, session.stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    status, gone = 0, False
    try:
        try:
            session.run()
        except PromesaError as exc:
            print(f"promesa-receiver listen: {exc}", file=sys.stderr)
            status, gone = 1, exc.status in (404, 409)
        if gone:
            if temporary:
                print("promesa-receiver listen: the session was deleted, by Promesa once it had not pulled for a "
                      "while (a laptop asleep) or by someone of the team; run listen again for a new one",
                      file=sys.stderr)
        elif temporary:
            status = _end(promesa, subscription_id, out) or status
        else:
            print(f"Stopped. {subscription_id} stays: this listen did not make it.", file=out, flush=True)
    except KeyboardInterrupt:
        print(f"promesa-receiver listen: interrupted again; {subscription_id} is left as it is"
              + (" (Promesa deletes it once idle)" if temporary else ""), file=sys.stderr)
        return 130
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return status


def _begin(promesa: Promesa, target: ForwardTarget, event_types: list[str], consumer: str | None,
           subscription_id: str | None, out: TextIO) -> str:
    """Make the listen session (its secret printed, once), or check the pull subscription to attach to."""
    if subscription_id is None:
        made = promesa.create(event_types, consumer, f"promesa-receiver listen on {socket.gethostname()}"[:500])
        subscription_id = made["id"]
        print(f"Listen session {subscription_id} ({', '.join(made['event_types'])}"
              f"{', consumer ' + made['consumer'] if made['consumer'] else ''}): a temporary pull subscription, "
              "deleted when you stop, or by Promesa once idle.", file=out)
        print(f"Signing secret, shown this once (your app verifies with it): {made['secret']}", file=out)
    else:
        attached = promesa.subscription(subscription_id)
        if attached["deleted_at"] or attached["mode"] != "pull":
            what = "deleted" if attached["deleted_at"] else "a push subscription"
            raise PromesaError(None, f"{subscription_id} is {what}: listen attaches to a pull subscription only")
        print(f"Attached to the pull subscription {subscription_id} ({', '.join(attached['event_types'])}): your "
              "app verifies with its secret. It stays when you stop.", file=out)
    print(f"Forwarding to {target.url}. Ctrl-C to stop.", file=out, flush=True)
    return subscription_id


def _end(promesa: Promesa, subscription_id: str, out: TextIO) -> int:
    """Delete the listen session; 1 (and why) when Promesa refuses."""
    try:
        deleted = promesa.delete(subscription_id)
    except PromesaError as exc:
        print(f"promesa-receiver listen: could not delete {subscription_id} ({exc}); Promesa deletes it once "
              "idle", file=sys.stderr)
        return 1
    cancelled = deleted.get("cancelled") or 0
    waiting = f"; its {cancelled} waiting deliver{'y was' if cancelled == 1 else 'ies were'} cancelled" if cancelled else ""
    print(f"Stopped. Deleted the listen session {subscription_id}{waiting}.", file=out, flush=True)
    return 0
