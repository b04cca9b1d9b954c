"""An OAuth2 token server on 127.0.0.1 for the tests (client credentials grant, RFC 6749 4.4), and a receiver that
accepts only the tokens it issued and has not revoked.

POST /token with HTTP Basic client authentication (id and secret form-urlencoded first, RFC 6749 2.3.1) and a form
body: 200 {"access_token": "tok-<n>-…", "token_type": "Bearer", "expires_in"} for the right client, 401
{"error": "invalid_client"} otherwise; `status` set: that status instead. Every request is counted and kept.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote_plus

from tests.support.receiver import Receiver, Serving


class TokenServer(Serving):
    def __init__(self, client_id: str = "promesa", client_secret: str | None = None, expires_in: int | None = 3600):
        self.client_id = client_id
        self.client_secret = client_secret or f"cs-{uuid.uuid4().hex}"
        self.expires_in = expires_in
        self.status: int | None = None  # set: every request is answered with it
        self.requests: list[dict] = []  # {"client": (id, secret), "form": {...}}
        self.issued: list[str] = []
        self.valid: set[str] = set()
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                form = {k: v[0] for k, v in parse_qs(raw).items()}
                status, answer = server.answer(self.headers.get("Authorization", ""), form,
                                               self.headers.get("Content-Type", ""))
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"

    def answer(self, authorization: str, form: dict, content_type: str) -> tuple[int, dict]:
        client = None
        if authorization.startswith("Basic "):
            user, _, password = base64.b64decode(authorization[6:]).decode().partition(":")
            client = (unquote_plus(user), unquote_plus(password))
        with self.lock:
            self.requests.append({"client": client, "form": form, "content_type": content_type})
            if self.status is not None:
                return self.status, {"error": "temporarily_unavailable"}
            if client != (self.client_id, self.client_secret) or form.get("grant_type") != "client_credentials":
                return 401, {"error": "invalid_client"}
            token = f"tok-{len(self.issued) + 1}-{uuid.uuid4().hex}"
            self.issued.append(token)
            self.valid.add(token)
        return 200, {"access_token": token, "token_type": "Bearer"} | (
            {"expires_in": self.expires_in} if self.expires_in is not None else {})

    def asked(self) -> int:
        with self.lock:
            return len(self.requests)

    def revoke_all(self) -> None:
        with self.lock:
            self.valid.clear()

    def auth(self, **more) -> dict:
        """The subscription's `auth` for this server."""
        return {"type": "oauth2_client_credentials", "token_url": self.url, "client_id": self.client_id,
                "client_secret": self.client_secret} | more



class BearerReceiver(Receiver):
    """A receiver behind a gateway that checks bearer tokens: 401 to any request without one the token server
    issued and has not revoked, as Receiver to one with it."""

    def __init__(self, tokens: TokenServer):
        super().__init__()
        self.tokens = tokens

    def behaviour(self, path: str, n: int) -> tuple[int, dict]:
        given = self.asking.headers.get("Authorization", "")
        with self.tokens.lock:
            valid = given.startswith("Bearer ") and given[7:] in self.tokens.valid
        if not valid:
            return 401, {"WWW-Authenticate": 'Bearer error="invalid_token"'}
        return super().behaviour(path, n)
