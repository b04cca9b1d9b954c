"""The real service on a loopback port, and a loopback proxy in front of it that answers as scripted
(503 or 429 with Retry-After, or a dropped connection) before it passes requests through."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from werkzeug.serving import make_server


@contextmanager
def serving(server):
    """`server` answering on its own thread until the block ends; then its port is closed."""
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def live_url(app):
    """The test's app served by a real HTTP server on 127.0.0.1."""
    with serving(make_server("127.0.0.1", 0, app, threaded=True)) as server:
        yield f"http://127.0.0.1:{server.server_port}"


@dataclass
class Seen:
    path: str
    body: bytes
    answered: int | None  # the status the client got; None for a dropped connection


class Proxy:
    """Answers the next scripted steps itself, then forwards to `upstream`. A step is a status with
    headers (e.g. (503, {"Retry-After": "2"})), "drop" (close without answering), or "pass then drop"
    (forward, let the service store it, but lose its answer)."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.script: list = []
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy.lock:
                    step = proxy.script.pop(0) if proxy.script else "pass"
                if step in ("pass", "pass then drop"):
                    status, headers, answer = proxy.forward(self.path, body, self.headers, self.command)
                    if step == "pass then drop":
                        step = "drop"
                else:
                    status, headers, answer = step[0], step[1], b'{"error": "scripted"}'
                    headers = {"Content-Type": "application/json", **headers}
                with proxy.lock:
                    proxy.seen.append(Seen(self.path, body, None if step == "drop" else status))
                if step == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_PUT = do_POST  # put_consumer: the same script, forwarded as a PUT

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def forward(self, path: str, body: bytes, headers, method: str = "POST") -> tuple[int, dict, bytes]:
        keep = {k: v for k, v in headers.items() if k.lower() in ("authorization", "content-type", "idempotency-key")}
        request = urllib.request.Request(self.upstream + path, data=body, headers=keep, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return resp.status, {"Content-Type": resp.headers["Content-Type"]}, resp.read()
        except urllib.error.HTTPError as err:
            with err:
                return err.code, {"Content-Type": err.headers.get("Content-Type", "application/json")}, err.read()


@pytest.fixture
def proxy(live_url):
    p = Proxy(live_url)
    with serving(p.server):
        yield p


@pytest.fixture
def refused_url():
    """A loopback URL where nothing listens: every connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class Sleeps(list):
    """An injected sleep that records each wait instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps():
    return Sleeps()
