"""What every web response carries for the browser's protection: security headers, cookie flags,
and the proxy headers trusted only when a proxy is configured (PROMESA_TRUSTED_PROXIES); and who
may read the operators' probes (/metrics, /readyz?verbose=1) without a session."""

from __future__ import annotations

import hmac
import ipaddress

from flask import Flask, abort, current_app, request
from flask.sessions import SecureCookieSessionInterface
from werkzeug.middleware.proxy_fix import ProxyFix
from werkzeug.routing import IntegerConverter

from dashboard.core.validation import MAX_ID
from dashboard.web.paths import API_PREFIX, PORTAL_PREFIX, in_portal

# The pages use no inline script or style (htmx is configured not to inject its indicator style).
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'")

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
}


PORTAL_COOKIE = "promesa_portal"


class SessionCookieSecureOverHttps(SecureCookieSessionInterface):
    """The session cookie is `Secure` whenever the request came over https (always, if
    SESSION_COOKIE_SECURE is set), so a later plain-http request can never carry it.

    The consumer portal has a cookie of its own, sent only to /portal and read only there: a portal session
    never reaches a dashboard page, and a dashboard session never reaches the portal. Over https it is
    `SameSite=None; Secure; Partitioned`, so it works inside the producer's iframe (docs/portal.md)."""

    def get_cookie_name(self, app: Flask) -> str:
        return PORTAL_COOKIE if in_portal() else super().get_cookie_name(app)

    def get_cookie_path(self, app: Flask) -> str:
        return PORTAL_PREFIX if in_portal() else super().get_cookie_path(app)

    def get_cookie_secure(self, app: Flask) -> bool:
        return bool(super().get_cookie_secure(app) or request.is_secure)

    def get_cookie_samesite(self, app: Flask) -> str | None:
        if in_portal() and request.is_secure:
            return "None"
        return super().get_cookie_samesite(app)

    def get_cookie_partitioned(self, app: Flask) -> bool:
        return (in_portal() and request.is_secure) or super().get_cookie_partitioned(app)

    def open_session(self, app: Flask, request):
        # The API answers to a bearer token alone, so it skips the cookie session's signing serializer.
        if request.path.startswith(API_PREFIX):
            return self.make_null_session(app)
        return super().open_session(app, request)


class Int64Converter(IntegerConverter):
    """`<int:…>` in every route: an id past 64 bits is no row's (404), not a database error (500)."""

    def __init__(self, map, *args, **kwargs):
        kwargs.setdefault("max", MAX_ID)
        super().__init__(map, *args, **kwargs)


def trusts_a_proxy(app: Flask) -> bool:
    return int(app.config["PROMESA_TRUSTED_PROXIES"]) > 0


def client_on_this_machine() -> bool:
    """Did the request come from this machine? Never knowable behind a trusted proxy: the address is
    then what X-Forwarded-For says, and anyone who reaches the web directly may say 127.0.0.1."""
    if trusts_a_proxy(current_app):
        return False
    try:
        return ipaddress.ip_address(request.remote_addr or "").is_loopback
    except ValueError:
        return False


def metrics_token_given() -> bool:
    """Does the request carry `Authorization: Bearer <PROMESA_METRICS_TOKEN>` (when one is set)?"""
    token = current_app.config.get("PROMESA_METRICS_TOKEN")
    given = request.headers.get("Authorization", "")
    return bool(token) and hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


def init_app(app: Flask) -> None:
    app.url_map.converters["int"] = Int64Converter
    proxies = int(app.config["PROMESA_TRUSTED_PROXIES"])
    if proxies > 0:
        # Only behind a configured proxy may X-Forwarded-For/-Proto decide the client's address and https.
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=proxies, x_proto=proxies)
    app.session_interface = SessionCookieSecureOverHttps()
    app.before_request(_refuse_nul_in_addresses)
    app.after_request(_security_headers)


FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")


def _refuse_nul_in_addresses():
    # PostgreSQL can neither store nor compare text with NUL in it (a 500), and no id, cursor or form field
    # needs one; the API's error handler answers this abort in its own JSON shape.
    if "\x00" in request.path or request.query_string and any(
            "\x00" in key or "\x00" in value for key, value in request.args.items(multi=True)):
        abort(400, description="the path and the query must not contain NUL characters")
    if request.mimetype in FORMS and any("\x00" in key or "\x00" in value
                                         for key, value in request.form.items(multi=True)):
        abort(400, description="form fields must not contain NUL characters")
    return None


def _security_headers(response):
    present = {name.lower() for name in response.headers.keys()}  # one pass, not one per header
    if "frame-ancestors 'none'" not in response.headers.get("Content-Security-Policy", "frame-ancestors 'none'"):
        present.add("x-frame-options")  # the portal's own policy lets named origins frame it: no DENY beside it
    response.headers.extend((name, value) for name, value in SECURITY_HEADERS.items() if name.lower() not in present)
    if request.endpoint != "static":
        # Pages carry a CSRF token and team data, API answers may carry a secret shown once: never keep them.
        response.headers["Cache-Control"] = "no-store"
    return response
