"""A producer publishing over HTTP on a thread of its own, throughout a fault."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter


class RawPublisher(threading.Thread):
    """POSTs one event at a time, as a careful producer without the client would: each with its
    Idempotency-Key, and a 503 tried again after its Retry-After. Keeps every answer, and when each
    accepted event was first posted (`posted_at`, unix time)."""

    def __init__(self, url: str, token: str, stop: threading.Event):
        super().__init__(daemon=True)
        self.url, self.token, self.stop = url, token, stop
        self.accepted: list[str] = []
        self.posted_at: dict[str, float] = {}
        self.answers: Counter = Counter()
        self.retry_after: list[str | None] = []  # of each 503

    def post(self, key: str, n: int) -> str | None:
        body = json.dumps({"type": "file.updated", "data": {"raw": n}}).encode()
        request = urllib.request.Request(self.url + "/api/v1/events", data=body, method="POST", headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json", "Idempotency-Key": key})
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                self.answers[resp.status] += 1
                return json.loads(resp.read())["id"]
        except urllib.error.HTTPError as error:
            self.answers[error.code] += 1
            if error.code == 503:
                self.retry_after.append(error.headers.get("Retry-After"))
        except OSError:
            self.answers["refused"] += 1
        return None

    def run(self):
        n = 0
        while not self.stop.is_set():
            key, n, posted_at = str(uuid.uuid4()), n + 1, time.time()
            while (accepted := self.post(key, n)) is None:
                wait = float(self.retry_after[-1]) if self.answers[503] and self.retry_after[-1] else 1.0
                time.sleep(min(wait, 2.0))  # a test's patience, not the answer's: it comes back sooner
            self.accepted.append(accepted)
            self.posted_at[accepted] = posted_at
            time.sleep(0.1)


class ClientPublisher(threading.Thread):
    """The producer client, with a spool: what it could not hand over in its retries waits there for flush()."""

    def __init__(self, url: str, token: str, spool: str, stop: threading.Event):
        import promesa_producer  # its own distribution (sdk/producer): a test without it skips before this

        super().__init__(daemon=True)
        # A producer that will not wait 5 s per event: a Retry-After beyond a second spools it at once.
        self.client = promesa_producer.Client(url, token, retries=3, backoff=0.2, max_retry_after=1.0, spool=spool,
                                              timeout=10)
        self.stop = stop
        self.accepted: list[str] = []
        self.given = 0
        self.spooled = 0

    def run(self):
        while not self.stop.is_set():
            self.given += 1
            published = self.client.publish("file.updated", {"client": self.given})
            if published.spooled:
                self.spooled += 1  # flush() sends it once the service takes events again
            else:
                self.accepted.append(published.id)
            time.sleep(0.2)

    def flush(self) -> list[str]:
        flushed = self.client.flush()
        assert not flushed.rejected and self.client.spool.pending() == 0, flushed
        self.accepted += [p.id for p in flushed.published]
        assert len(self.accepted) == self.given  # every event the client was handed is now handed over
        return self.accepted
