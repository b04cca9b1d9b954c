"""OAuth2 client credentials (RFC 6749 section 4.4): the bearer token a receiver's subscription asks for
(dashboard.subscriptions.client_auth keeps its credentials).

`Tokens` gets a token from the token URL through the delivery client (`http.post`: the engine's session, so the
same SSRF rules, no redirect followed, the subscription's connect and attempt timeouts), and keeps it per
subscription and stored credentials (an edit makes a new ciphertext, so a new token) until shortly before it
expires, by the injected clock. Every delivery of the worker shares it, and however many wait for one, it is
asked for once. `authorized` sends an attempt with it, and on a 401 gets a fresh one and tries once more.

A token endpoint that fails is the attempt's error, "auth failed: …" (never an exception out of here). No token,
client secret or Authorization header is ever logged, recorded or put in an error.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import quote_plus, urlencode

from dashboard.core.clock import unix
from dashboard.delivery import failures, http
from dashboard.delivery.policies import Outcome

# No expires_in in the answer: the token is used this long (docs/api.md, OAuth2 client credentials).
DEFAULT_LIFETIME_SECONDS = 300
# A token is asked for again this long before it expires (half its life, for a shorter one) ...
EXPIRY_MARGIN_SECONDS = 30
# ... and kept at most this long, whatever expires_in says.
MAX_LIFETIME_SECONDS = 86400
ANSWER_BYTES = 64 * 1024  # a token endpoint's answer is read up to this much
ERROR_PREFIX = f"{failures.AUTH_FAILED}: "
# What may go in an Authorization header: visible ASCII (RFC 6750's b64token is narrower; servers vary).
_TOKEN = re.compile(r"^[\x21-\x7e]{1,8192}$")
_OAUTH_ERROR = re.compile(r"^[A-Za-z0-9_.-]{1,60}$")  # an RFC 6749 5.2 error code, shown as is


class AuthFailed(Exception):
    """No token: the message starts with "auth failed: " and says why, never with a token or secret in it."""

    def __init__(self, why: str):
        super().__init__((ERROR_PREFIX + why)[:failures.ERROR_LENGTH])


@dataclass(frozen=True)
class ClientCredentials:
    TYPE = "oauth2_client_credentials"

    token_url: str
    client_id: str
    client_secret: str
    scope: str | None = None
    audience: str | None = None

    @classmethod
    def from_json(cls, text: str) -> ClientCredentials:
        stored = json.loads(text)
        return cls(stored["token_url"], stored["client_id"], stored["client_secret"], stored.get("scope"),
                   stored.get("audience"))

    def __repr__(self) -> str:  # never the secret, in a traceback or a log line
        return f"ClientCredentials(token_url={self.token_url!r}, client_id={self.client_id!r})"

    def request(self) -> tuple[bytes, dict[str, str]]:
        """The token request's form body and headers; the client authenticates with HTTP Basic, its id and
        secret each form-urlencoded first (RFC 6749 section 2.3.1)."""
        form = {"grant_type": "client_credentials"}
        form |= {name: value for name, value in (("scope", self.scope), ("audience", self.audience)) if value}
        basic = base64.b64encode(f"{quote_plus(self.client_id)}:{quote_plus(self.client_secret)}".encode()).decode()
        return urlencode(form).encode(), {"Authorization": f"Basic {basic}",
                                          "Content-Type": "application/x-www-form-urlencoded",
                                          "Accept": "application/json", "User-Agent": http.USER_AGENT,
                                          "Accept-Encoding": "identity"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def token_from(result: http.AttemptResult) -> tuple[str, float]:
    """The access token and the seconds it lasts, from the token endpoint's answer; AuthFailed otherwise."""
    outcome = result.outcome
    if outcome.status_code is None:
        raise AuthFailed(f"token endpoint: {outcome.error}")
    answer = _json_object(result.response_excerpt)
    if not 200 <= outcome.status_code < 300:
        code = answer.get("error") if answer else None
        said = f" ({code})" if isinstance(code, str) and _OAUTH_ERROR.match(code) else ""
        if 300 <= outcome.status_code < 400:
            said += ": redirects are not followed"
        raise AuthFailed(f"the token endpoint answered {outcome.status_code}{said}")
    if answer is None:
        raise AuthFailed("the token endpoint's answer is not a JSON object")
    token = answer.get("access_token")
    if not isinstance(token, str) or not _TOKEN.match(token):
        raise AuthFailed("the token endpoint's answer has no usable access_token")
    kind = answer.get("token_type")
    if kind is not None and (not isinstance(kind, str) or kind.lower() != "bearer"):
        raise AuthFailed("the token endpoint's token_type is not Bearer")
    return token, _lifetime(answer.get("expires_in"))


def _json_object(text: str | None) -> dict | None:
    try:
        answer = json.loads(text or "")
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def _lifetime(expires_in) -> float:
    """How long to use a token: expires_in (a number, or digits as some servers send it) less a margin."""
    if isinstance(expires_in, str) and expires_in.strip().isascii() and expires_in.strip().isdigit():
        expires_in = int(expires_in)
    if isinstance(expires_in, bool) or not isinstance(expires_in, (int, float)) or not expires_in > 0:
        expires_in = DEFAULT_LIFETIME_SECONDS
    lasts = min(float(expires_in), MAX_LIFETIME_SECONDS)
    return lasts - min(EXPIRY_MARGIN_SECONDS, lasts / 2)


class Tokens:
    """The bearer tokens of one worker (or one receiver check), by subscription and stored credentials.
    `decrypt` turns `Subscription.auth_ciphertext` into its JSON text. Use it from one thread."""

    def __init__(self, clock, decrypt: Callable[[str], str], allow_private: bool):
        self.clock = clock
        self.decrypt = decrypt
        self.allow_private = allow_private
        self.asked = 0  # requests made to token endpoints
        self._kept: dict[tuple[str, str], tuple[str, float]] = {}  # (subscription, ciphertext): (token, until)
        self._asking: dict[tuple[str, str], asyncio.Task] = {}
        self._credentials: dict[str, ClientCredentials] = {}

    def credentials(self, ciphertext: str) -> ClientCredentials:
        found = self._credentials.get(ciphertext)
        if found is None:
            found = self._credentials[ciphertext] = ClientCredentials.from_json(self.decrypt(ciphertext))
        return found

    async def token(self, session, subscription_id: str, ciphertext: str, *, connect_timeout: float,
                    attempt_timeout: float, refused: str | None = None) -> str:
        """A token that has not expired (by the clock), and not `refused` (one the receiver answered 401 to):
        the kept one, or the one being asked for, or a new one. AuthFailed when the token endpoint fails."""
        key = (subscription_id, ciphertext)
        kept = self._kept.get(key)
        if kept is not None and kept[0] != refused and kept[1] > unix(self.clock.now()):
            return kept[0]
        loop = asyncio.get_running_loop()
        asking = self._asking.get(key)
        if asking is None or asking.get_loop() is not loop:  # one question at a time, whoever waits
            asking = self._asking[key] = loop.create_task(
                self._ask(session, key, connect_timeout=connect_timeout, attempt_timeout=attempt_timeout))
            asking.add_done_callback(lambda task: self._asked(key, task))
        return await asyncio.shield(asking)

    async def _ask(self, session, key: tuple[str, str], *, connect_timeout: float, attempt_timeout: float) -> str:
        try:
            credentials = self.credentials(key[1])
        except Exception:  # noqa: BLE001 - a key that no longer decrypts: said without its details
            raise AuthFailed("the stored client credentials cannot be read (was PROMESA_SECRET_KEY changed?)") from None
        body, headers = credentials.request()
        self.asked += 1
        result = await http.post(session, credentials.token_url, body, headers, connect_timeout=connect_timeout,
                                 attempt_timeout=attempt_timeout, excerpt_bytes=ANSWER_BYTES,
                                 allow_private=self.allow_private)
        token, lasts = token_from(result)
        for other in [k for k in self._kept if k[0] == key[0]]:  # an edit's older credentials are done with
            del self._kept[other]
        self._kept[key] = (token, unix(self.clock.now()) + lasts)
        return token

    def _asked(self, key: tuple[str, str], task: asyncio.Task) -> None:
        if self._asking.get(key) is task:
            del self._asking[key]
        if not task.cancelled():
            task.exception()  # retrieved: the waiters (if any are left) have it too

    async def authorized(self, session, subscription_id: str, ciphertext: str, headers: dict[str, str],
                         post: Callable[[dict[str, str]], Awaitable[http.AttemptResult]], *,
                         connect_timeout: float, attempt_timeout: float) -> http.AttemptResult:
        """`post(headers)` with the subscription's bearer token; on a 401, once more with a fresh token (when
        the token endpoint gives another). Never raises for the token endpoint: its failure is the result."""
        timeouts = {"connect_timeout": connect_timeout, "attempt_timeout": attempt_timeout}
        try:
            token = await self.token(session, subscription_id, ciphertext, **timeouts)
            result = await post(headers | bearer(token))
            if result.outcome.status_code != 401:
                return result
            fresh = await self.token(session, subscription_id, ciphertext, refused=token, **timeouts)
            return result if fresh == token else await post(headers | bearer(fresh))
        except AuthFailed as exc:
            return http.AttemptResult(Outcome(error=str(exc)), 0, None)
