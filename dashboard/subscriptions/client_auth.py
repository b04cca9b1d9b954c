"""A receiver's OAuth2 client credentials on its subscription (issue 39): `"auth": {"type":
"oauth2_client_credentials", "token_url", "client_id", "client_secret", "scope"?, "audience"?}`. Promesa gets a
bearer token from the token URL (dashboard.delivery.oauth) and sends it with every attempt, test event and
receiver check.

The client secret is a credential. The whole object is kept encrypted as the signing secret is (one column,
`Subscription.auth_ciphertext`: Fernet of a JSON object), and the secret is never shown again: reads, pages, the
audit log and exports show the other fields with MASK for it.

An edit gives the whole object or null (which removes it). Without `client_secret`, the stored secret is kept,
as long as the token URL and client id stay what they were (a secret belongs to its client at its server).
"""

from __future__ import annotations

import json

from flask import current_app

from dashboard.core import crypto
from dashboard.core.validation import ApiError
from dashboard.delivery.oauth import ClientCredentials
from dashboard.delivery.targets import url_problem
from dashboard.models import Subscription
from dashboard.subscriptions import own_headers
from dashboard.subscriptions.own_headers import MASK

TYPE = ClientCredentials.TYPE
# The header the token goes in: a receiver's own header of that name would say otherwise.
HEADER = "Authorization"


def stored(sub: Subscription) -> dict | None:
    """The subscription's credentials, in clear (the stored form, secret included): for sending only."""
    return json.loads(crypto.decrypt(sub.auth_ciphertext)) if sub.auth_ciphertext else None


def masked(auth: dict | None) -> dict | None:
    """What reads show: every field but the secret, which is MASK."""
    if auth is None:
        return None
    return {"type": auth["type"], "token_url": auth["token_url"], "client_id": auth["client_id"],
            "client_secret": MASK, "scope": auth.get("scope"), "audience": auth.get("audience")}


def masked_of(sub: Subscription) -> dict | None:
    return masked(stored(sub))


def ciphertext(auth: dict | None) -> str | None:
    """What `Subscription.auth_ciphertext` holds for these credentials (None for none)."""
    return crypto.encrypt(json.dumps(auth, separators=(",", ":"))) if auth else None


def _token_url_checked(token_url: str) -> None:
    """The token URL is where Promesa sends a request too: the endpoint URL's rules (SSRF ones included)."""
    problem = url_problem(token_url, current_app.config["PROMESA_ALLOW_PRIVATE_TARGETS"])
    if problem:
        raise ApiError(422, "auth.token_url: " + problem.removeprefix("url ").removeprefix("url: "))


def _stored_form(given: dict, secret: str) -> dict:
    return {"type": TYPE, "token_url": given["token_url"], "client_id": given["client_id"], "client_secret": secret,
            "scope": given.get("scope") or None, "audience": given.get("audience") or None}


def checked(given: dict | None, headers: dict[str, str]) -> dict | None:
    """New credentials as stored (None: none), or a 422 saying what is wrong that the schema cannot say."""
    if given is None:
        return None
    _token_url_checked(given["token_url"])
    refuse_header_clash(headers, True)
    return _stored_form(given, given["client_secret"])


def merged(sub: Subscription, given: dict | None, headers: dict[str, str]) -> dict | None:
    """The credentials after an edit's `auth` (None: removed), checked; a missing secret keeps the stored one."""
    if given is None:
        return None
    before = stored(sub)
    secret = given.get("client_secret")
    if secret is None:
        same_client = before is not None and (before["token_url"], before["client_id"]) == (
            given["token_url"], given["client_id"])
        if not same_client:
            raise ApiError(422, "auth.client_secret is required: "
                                + ("this subscription has no client credentials yet" if before is None else
                                   "the token URL or client id changed, and the stored secret belongs to the old "
                                   "ones"))
        secret = before["client_secret"]
    if before is None or given["token_url"] != before["token_url"]:
        _token_url_checked(given["token_url"])
    refuse_header_clash(headers, True)
    return _stored_form(given, secret)


UNCHANGED = object()  # an edit that gives no auth


def edited(sub: Subscription, given, headers: dict[str, str] | None) -> tuple[dict | None, dict | None] | None:
    """An edit's `auth` (a ClientCredentialsEdit, None to remove, or UNCHANGED) with the edit's own headers
    (None: unchanged): (before, after) when the credentials change, else None; 422 for what is wrong."""
    if given is UNCHANGED:
        if headers is not None:
            refuse_header_clash(headers, sub.auth_ciphertext is not None)
        return None
    before = stored(sub)
    after = merged(sub, given.model_dump() if given is not None else None,
                   headers if headers is not None else own_headers.stored(sub))
    return None if after == before else (before, after)


def refuse_header_clash(headers: dict[str, str], has_auth: bool) -> None:
    """422 when the receiver's own headers set Authorization and the bearer token would too."""
    clash = [name for name in headers if name.lower() == HEADER.lower()]
    if has_auth and clash:
        raise ApiError(422, f"headers: {clash[0]} carries the OAuth2 bearer token of auth: remove the header, or auth")


def audit_view(before: dict | None, after: dict | None) -> tuple[dict | None, dict | None]:
    """Before and after an edit as the audit log keeps them: masked, a replaced secret said so."""
    shown_after = masked(after)
    if after is not None and (before is None or before["client_secret"] != after["client_secret"]):
        shown_after["client_secret"] = f"{MASK} (new value)"
    return masked(before), shown_after


def in_words(auth: dict | None) -> str:
    """One line for pages and flashes: the token URL and client id (never the secret)."""
    if auth is None:
        return "none"
    extra = "".join(f", {name} {auth[name]}" for name in ("scope", "audience") if auth.get(name))
    renewed = ", a new secret" if auth.get("client_secret", "").endswith("(new value)") else ""
    return f"from {auth['token_url']} as client {auth['client_id']}{extra}{renewed}"


def masked_header(sub: Subscription) -> dict[str, str]:
    """The token's header as a page shows a request as sent: its name, the token masked."""
    return {HEADER: f"Bearer {MASK}"} if sub.auth_ciphertext else {}


def contract_text(sub: Subscription) -> dict:
    """What the contract says of the endpoint's OAuth2 client credentials: the token URL and client id only."""
    auth = masked_of(sub)
    if auth is None:
        return {"token_url": None, "client_id": None,
                "text": "None: requests carry no bearer token."}
    return {"token_url": auth["token_url"], "client_id": auth["client_id"],
            "text": f"Every delivery, test event and receiver check carries Authorization: Bearer <token>, a token "
                    f"Promesa gets from your token URL {auth['token_url']} as client {auth['client_id']} (OAuth2 "
                    "client credentials) and uses until shortly before it expires. Answer 401 to a request without "
                    "a valid token: Promesa then gets a fresh token and tries once more, and the receiver check "
                    "sends one correctly signed request without it (credentials_required). The token proves "
                    "nothing about the body: verify the signature as well."}
