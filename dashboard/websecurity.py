"""What every web response carries for the browser's protection: security headers, cookie flags,
and the proxy headers trusted only when a proxy is configured (PROMESA_TRUSTED_PROXIES)."""

from __future__ import annotations

from flask import Flask, abort, request
from flask.sessions import SecureCookieSessionInterface
from werkzeug.middleware.proxy_fix import ProxyFix

from .api import URL_PREFIX as API_PREFIX

# The pages use no inline script or style (htmx is configured not to inject its indicator style).
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'")

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
}


class SessionCookieSecureOverHttps(SecureCookieSessionInterface):
    """The session cookie is `Secure` whenever the request came over https (always, if
    SESSION_COOKIE_SECURE is set), so a later plain-http request can never carry it."""

    def get_cookie_secure(self, app: Flask) -> bool:
        return bool(super().get_cookie_secure(app) or request.is_secure)

    def open_session(self, app: Flask, request):
        # The producer API answers to a bearer token alone: it never reads the cookie session, and opening
        # it (a signing serializer per request) cost a tenth of an ingest request's CPU.
        if request.path.startswith(API_PREFIX):
            return self.make_null_session(app)
        return super().open_session(app, request)


def init_app(app: Flask) -> None:
    proxies = int(app.config["PROMESA_TRUSTED_PROXIES"])
    if proxies > 0:
        # Only behind a configured proxy may X-Forwarded-For/-Proto decide the client's address and https.
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=proxies, x_proto=proxies)
    app.session_interface = SessionCookieSecureOverHttps()
    app.before_request(_refuse_nul_in_page_addresses)
    app.after_request(_security_headers)


def _refuse_nul_in_page_addresses():
    # PostgreSQL cannot compare text with NUL in it (a 500); no page address has one. The API answers
    # bad input in its own JSON shape, so it checks its own.
    if request.blueprint == "api":
        return None
    if "\x00" in request.path or any("\x00" in k or "\x00" in v for k, v in request.args.items(multi=True)):
        abort(400, description="The address contains a NUL character.")
    return None


def _security_headers(response):
    present = {name.lower() for name in response.headers.keys()}  # one pass, not one per header
    response.headers.extend((name, value) for name, value in SECURITY_HEADERS.items() if name.lower() not in present)
    if request.endpoint != "static":
        # Pages carry a CSRF token and team data, API answers may carry a secret shown once: never keep them.
        response.headers["Cache-Control"] = "no-store"
    return response
