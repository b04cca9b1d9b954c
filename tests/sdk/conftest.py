"""Real HTTP receivers on 127.0.0.1 for the receiver check, shared by its API and command tests."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from promesa_receiver import VerificationError, verify
from promesa_receiver.signing import new_secret
from werkzeug.serving import make_server

from examples.receiver.app import create_app as create_receiver_app

from ..support.receiver import Receiver, Serving

DEPENDENTS = {"forged_rejected", "stale_rejected", "tampered_rejected"}


class CheckReceiver(Receiver):
    """The test receiver, plus ``/moved``: 301 to an absolute URL."""

    def behaviour(self, path: str, n: int) -> tuple[int, dict]:
        if path == "/moved":
            return 301, {"Location": self.url + "/final"}
        return super().behaviour(path, n)


# The deliberately bad receivers: (the rules that must fail, the rules that must be null).
CASES = {
    "careless": (DEPENDENTS, {"https"}),  # 200 to everything
    "redirect": ({"signed_accepted", "no_redirect"}, DEPENDENTS | {"duplicate_accepted", "https"}),
    "slow": ({"fast_answer"}, {"https"}),  # the example receiver, its first answer after 6 s
    "error": ({"signed_accepted"}, DEPENDENTS | {"duplicate_accepted", "https"}),  # 500 to everything
}
SLOW_SECONDS = 6
# What the wrong-secret receiver answers to a request it cannot verify: markup a page must show as text.
REFUSAL_BODY = '<script>alert("refused")</script> signature mismatch'


class WrongSecretReceiver(Serving):
    """A careful receiver that holds the wrong secret: it verifies every request's X-Signature (with
    promesa_receiver.verify) against a secret of its own, answers 401 and REFUSAL_BODY when that fails, 200 else.
    Given a `secret` it holds that one instead; given an `api_key`, it first refuses (401) a request whose
    X-Api-Key is not that key, as a gateway would."""

    def __init__(self, secret: str | None = None, api_key: str | None = None):
        self.secret = secret or new_secret()  # by default never the subscription's
        self.api_key = api_key
        self.server = make_server("127.0.0.1", 0, self.answer, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def answer(self, environ, start_response):
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        if self.api_key is not None and environ.get("HTTP_X_API_KEY") != self.api_key:
            start_response("401 Unauthorized", [("Content-Type", "text/plain")])
            return [b"X-Api-Key required"]
        try:
            verify(body, environ.get("HTTP_X_SIGNATURE"), [self.secret])
        except VerificationError:
            start_response("401 Unauthorized", [("Content-Type", "text/html")])
            return [REFUSAL_BODY.encode()]
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]


@pytest.fixture
def wrong_secret_receiver():
    with WrongSecretReceiver() as receiver:
        yield receiver


@pytest.fixture
def bad_receiver():
    with CheckReceiver() as receiver:
        yield receiver


@pytest.fixture
def case_url(request, bad_receiver, example, secret) -> str:
    """The URL of the receiver of the test's ``case`` (one of CASES), signing with ``secret``."""
    case = request.getfixturevalue("case")
    if case == "slow":
        return example.start(secret, first_delay=SLOW_SECONDS)
    return bad_receiver.url + {"careless": "/ok", "redirect": "/moved", "error": "/status/500"}[case]


class FirstSlow:
    """WSGI middleware: the first request waits (the check times the signed event, its first request)."""

    def __init__(self, app, delay: float):
        self.app, self.delay, self.waited = app, delay, threading.Event()

    def __call__(self, environ, start_response):
        if not self.waited.is_set():
            self.waited.set()
            time.sleep(self.delay)  # the behaviour under test is a slow answer: nothing to inject
        return self.app(environ, start_response)


class ExampleReceiver:
    """examples/receiver served on 127.0.0.1 (its own SQLite database, an RQ queue of its own)."""

    PATH = "/webhooks/promesa"

    def __init__(self, tmp_path, redis_url: str):
        self.tmp_path, self.redis_url = tmp_path, redis_url
        self.queue_name = f"promesa-receiver-check-{uuid.uuid4().hex[:12]}"
        self.app = None
        self.server = None

    def start(self, *secrets: str, scheme: str = "promesa", first_delay: float = 0) -> str:
        """Serve the example with these secrets; its URL."""
        self.app = create_receiver_app({
            "PROMESA_WEBHOOK_SECRETS": list(secrets),
            "PROMESA_SIGNATURE_SCHEME": scheme,
            "RECEIVER_DATABASE_URL": f"sqlite:///{self.tmp_path / 'receiver.db'}",
            "RECEIVER_REDIS_URL": self.redis_url,
            "RECEIVER_QUEUE": self.queue_name,
            "TESTING": True,
        })
        served = FirstSlow(self.app, first_delay) if first_delay else self.app
        self.server = make_server("127.0.0.1", 0, served, threaded=True)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_port}{self.PATH}"

    def queued_event_ids(self) -> list[str]:
        """The event id of each job the example enqueued (one per accepted request)."""
        return [job.args[0] for job in self.app.extensions["promesa_receiver"].queue.jobs]

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.app is not None:
            ext = self.app.extensions["promesa_receiver"]
            ext.storage.engine.dispose()
            ext.queue.delete(delete_jobs=True)
            keys = list(ext.redis.scan_iter(match=f"*{self.queue_name}*", count=1000))
            if keys:
                ext.redis.delete(*keys)
            ext.redis.close()


@pytest.fixture
def example(tmp_path, redis_url):
    running = ExampleReceiver(tmp_path, redis_url)
    yield running
    running.close()


@pytest.fixture
def secret() -> str:
    return new_secret()
