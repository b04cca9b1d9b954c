"""A real HTTP receiver on 127.0.0.1 for the tests. Each path has a behaviour:

  /ok               200
  /flaky/<n>        503 for the first n requests to that path, then 200
  /slow/<seconds>   sleeps, then 200
  /redirect         302 to /redirect-target (which must never be hit)
  /status/<code>    that status (e.g. /status/400, /status/410, /status/429)
  /ratelimit/<s>    429 with Retry-After: <s>
  /cookie           200 with a Set-Cookie (which a sender must never send back)
  /hang-after-head/<seconds>  200 and its headers at once, then nothing for that long (the body never comes)

Run as a program (`python receiver.py <address> <port>`), it serves until killed and writes each request
it gets as a line of JSON: `ReceiverOnHost` runs it on a host of a test's own (a network namespace).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict
    body: bytes
    at: float
    sender: str = ""  # the address it came from (which host, where a test has several)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # The engine opens dozens of connections to one receiver at once, as a real server's backlog takes:
    # socketserver's 5 drops the rest, whose SYNs come again 1, 2, 4, 8 s later or time out.
    request_queue_size = 128


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 (keep-alive, as senders pool connections), no line per request on stderr."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def read_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))


class Serving:
    """A server on a thread of its own while in a `with` block (`self.server`: a socketserver server)."""

    server: ThreadingHTTPServer

    def __enter__(self):
        # shutdown() waits for the loop's next poll: at the default 0.5 s, a quarter second in every test's teardown.
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class Heard:
    """The requests a receiver got, in order of arrival, and a wait for them."""

    def __init__(self):
        self.requests: list[Received] = []
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)

    def heard(self, request: Received) -> None:
        """Called with the lock held."""
        self.requests.append(request)
        self.arrived.notify_all()

    def count(self, path: str | None = None) -> int:
        with self.lock:
            return len(self.requests) if path is None else sum(1 for r in self.requests if r.path == path)

    def wait_for(self, n: int, timeout: float = 10.0) -> bool:
        """Block until at least n requests have arrived (condition wait, not a sleep)."""
        with self.arrived:
            return self.arrived.wait_for(lambda: len(self.requests) >= n, timeout)


class Receiver(Serving, Heard):
    # A port: to come back where a stopped receiver was; a host: an address other than loopback to listen on.
    def __init__(self, port: int = 0, host: str = "127.0.0.1"):
        Heard.__init__(self)
        self.hits: Counter = Counter()
        self.asking = threading.local()  # .headers: the request being answered, for a behaviour that reads them
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.read_body()
                with receiver.lock:
                    receiver.hits[self.path] += 1
                    n = receiver.hits[self.path]
                    receiver.heard(Received(self.path, dict(self.headers), body, time.time(), self.client_address[0]))
                if self.path.startswith("/hang-after-head/"):
                    return self.hang_after_head(float(self.path.rsplit("/", 1)[1]))
                receiver.asking.headers = self.headers
                status, headers = receiver.behaviour(self.path, n)
                payload = f"status {status} from {self.path}".encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the sender gave up (timeout); that is the point of some tests

            def hang_after_head(self, seconds: float):
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                self.wfile.flush()
                time.sleep(seconds)
                self.close_connection = True

        self.server = _Server((host, port), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"

    def behaviour(self, path: str, n: int) -> tuple[int, dict]:
        parts = path.strip("/").split("/")
        kind, arg = parts[0], parts[1] if len(parts) > 1 else ""
        if kind == "ok":
            return 200, {}
        if kind == "flaky":
            return (503, {}) if n <= int(arg) else (200, {})
        if kind == "slow":
            time.sleep(float(arg))
            return 200, {}
        if kind == "redirect":
            return 302, {"Location": "/redirect-target"}
        if kind == "status":
            return int(arg), {}
        if kind == "ratelimit":
            return 429, {"Retry-After": arg}
        if kind == "cookie":
            return 200, {"Set-Cookie": "session=from-one-receiver; Path=/"}
        return 404, {}

class GatedReceiver(Receiver):
    """A receiver behind a gateway that demands a header of its own (an API key): 401 to any request
    without `header: value`, as Receiver to one with it."""

    def __init__(self, header: str, value: str, port: int = 0):
        super().__init__(port)
        self.header, self.value = header, value

    def behaviour(self, path: str, n: int) -> tuple[int, dict]:
        if self.asking.headers.get(self.header) != self.value:
            return 401, {}
        return super().behaviour(path, n)


class ReceiverOnHost(Heard):
    """The Receiver as a process of its own, started under `run_in` (a host's `ip netns exec`), listening at
    `host`: what it gets comes back on its output into `requests`, complete once the `with` block has ended."""

    def __init__(self, run_in: tuple[str, ...], host: str, port: int = 8000):
        super().__init__()
        self.command = [*run_in, sys.executable, __file__, host, str(port)]
        self.url = f"http://{host}:{port}"

    def __enter__(self) -> ReceiverOnHost:
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, text=True)
        if self.process.stdout.readline().strip() != self.url:  # its first line: it listens
            self.process.kill()
            raise RuntimeError(f"the receiver did not start: {' '.join(self.command)}")
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        return self

    def _read(self) -> None:
        for line in self.process.stdout:
            told = json.loads(line)
            with self.lock:
                self.heard(Received(told["path"], told["headers"], told["body"].encode(), told["at"], told["sender"]))

    def __exit__(self, *exc) -> None:
        self.process.kill()
        self.process.wait(10)
        self.reader.join(10)


class TellingReceiver(Receiver):
    """A Receiver that writes each request it gets as a line of JSON, before it answers it."""

    def heard(self, request: Received) -> None:
        super().heard(request)
        print(json.dumps({"path": request.path, "headers": request.headers, "body": request.body.decode(),
                          "at": request.at, "sender": request.sender}), flush=True)


if __name__ == "__main__":
    with TellingReceiver(int(sys.argv[2]), sys.argv[1]) as telling:
        print(telling.url, flush=True)
        threading.Event().wait()  # until killed
