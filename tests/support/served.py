"""The test's app on a real threaded HTTP server on 127.0.0.1, and requests fired at it all at once."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from werkzeug.serving import make_server


@contextmanager
def served(app) -> Iterator[str]:
    """The app served by a thread per request, as gunicorn's threads would: its base URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def at_once(calls: list[Callable[[], object]]) -> list[object]:
    """Run every call in a thread of its own, released together by a barrier; their results, in order."""
    start = threading.Barrier(len(calls))

    def run(call):
        start.wait(timeout=30)
        return call()

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(run, calls))


def send(method: str, url: str, token: str, body: dict | None = None) -> int:
    """The status of one JSON request with a team's token (an error status too, never raised)."""
    request = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status
    except urllib.error.HTTPError as answer:
        return answer.code
