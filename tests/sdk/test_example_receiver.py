"""The example receiver (examples/receiver) run for real on 127.0.0.1, with the real Promesa
delivering to it: signed deliveries over HTTP, retries on the frozen clock, replays through
the API. Its RQ jobs run in this process (``SimpleWorker``, burst).

Between Promesa and the receiver sits ``Front``, a WSGI middleware standing for the network:
it records every request (as a tap on the wire would) and can make one event's requests
fail the two ways a network path fails:

- ``down``: the request never reaches the receiver (503 from the "proxy"), so Promesa retries;
- ``lose``: the receiver processes the request, then its 200 is lost and Promesa sees a 502.
  This is how real duplicates of work already done arise (a timeout, a proxy, a reset), and
  Promesa answers it by retrying on its schedule and, once dead-lettered, by replay.

Promesa itself runs on SQLite only (its database plays no part in the receiver's behaviour);
the receiver's own database is SQLite and PostgreSQL.
"""

from __future__ import annotations

import http.client
import io
import json
import threading
import uuid
from collections import Counter
from dataclasses import dataclass

import pytest
import redis
import sqlalchemy as sa
from rq import SimpleWorker
from rq.registry import FailedJobRegistry
from werkzeug.serving import make_server

from dashboard.core.clock import unix
from promesa_receiver.signing import new_secret, promesa_header, standard_headers
from examples.receiver import jobs as receiver_jobs
from examples.receiver.app import create_app as create_receiver_app
from examples.receiver.storage import files, inbox

from tests.conftest import fresh_postgres_database
from tests.support.pipeline import deliver_due

pytestmark = pytest.mark.parametrize("database_url", [pytest.param("sqlite", id="promesa_sqlite")], indirect=True)

PATH = "/webhooks/promesa"


# -- the network between Promesa and the receiver ----------------------------------------------
@dataclass
class Seen:
    event_id: str | None
    headers: dict
    body: bytes
    status: int
    answer: bytes


class Front:
    """WSGI middleware in front of the receiver app: records requests, injects network faults."""

    def __init__(self):
        self.app = None  # the receiver app, once it is configured with its secret
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._down: Counter = Counter()
        self._lose: Counter = Counter()

    def down(self, event_id: str, times: int = 1) -> None:
        """The next ``times`` requests for this event do not reach the receiver (503)."""
        self._down[event_id] += times

    def lose(self, event_id: str, times: int = 1) -> None:
        """The receiver handles the next ``times`` requests for this event, but its answer is lost (502)."""
        self._lose[event_id] += times

    def __call__(self, environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        event_id = environ.get("HTTP_X_EVENT_ID")  # Promesa's (unsigned) header: fine for a test tap
        with self._lock:
            fault = None
            if self._down[event_id] > 0:
                self._down[event_id] -= 1
                fault = "down"
            elif self._lose[event_id] > 0:
                self._lose[event_id] -= 1
                fault = "lose"
        if self.app is None or fault == "down":
            status, headers, answer = "503 SERVICE UNAVAILABLE", [("Content-Type", "text/plain")], b"unreachable"
        else:
            status, headers, answer = self._call_app(environ)
            if fault == "lose":
                status, headers, answer = "502 BAD GATEWAY", [("Content-Type", "text/plain")], b"answer lost"
        request_headers = {k[5:].replace("_", "-").title(): v for k, v in environ.items() if k.startswith("HTTP_")}
        with self._lock:
            self.seen.append(Seen(event_id, request_headers, body, int(status.split()[0]), answer))
        start_response(status, [(k, v) for k, v in headers if k.lower() != "content-length"]
                       + [("Content-Length", str(len(answer)))])
        return [answer]

    def _call_app(self, environ):
        got = {}

        def start_response(status, headers, exc_info=None):
            got["status"], got["headers"] = status, headers
            return lambda data: None

        result = self.app(environ, start_response)
        try:
            answer = b"".join(result)
        finally:
            if hasattr(result, "close"):
                result.close()
        return got["status"], got["headers"], answer

    def from_promesa(self, event_id: str) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.event_id == event_id]


class BurstWorker(SimpleWorker):
    """RQ's SimpleWorker minus its pubsub listener (remote commands for long-running workers),
    whose thread takes a second to stop at the end of every burst."""

    def subscribe(self):
        pass


# -- the receiver, running ------------------------------------------------------------------
class RunningReceiver:
    def __init__(self, database_url: str, redis_url: str, clock, monkeypatch):
        self.database_url = database_url
        self.redis_url = redis_url
        self.clock = clock
        self.queue_name = f"promesa-receiver-test-{uuid.uuid4().hex[:12]}"
        self.front = Front()
        self.server = make_server("127.0.0.1", 0, self.front, threaded=True)
        self.port = self.server.server_port
        self.url = f"http://127.0.0.1:{self.port}{PATH}"
        self.app = None
        self.applied: list[str] = []  # event ids, each time the work (apply_file_change) runs
        real_apply = receiver_jobs.apply_file_change

        def counting_apply(conn, event, storage):
            self.applied.append(event.event_id)
            return real_apply(conn, event, storage)

        monkeypatch.setattr(receiver_jobs, "apply_file_change", counting_apply)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def start(self, *secrets: str, **config):
        """Configure the receiver with the subscription's secret(s) and put it behind the front."""
        self.app = create_receiver_app({
            "PROMESA_WEBHOOK_SECRETS": list(secrets),
            "RECEIVER_DATABASE_URL": self.database_url,
            "RECEIVER_REDIS_URL": self.redis_url,
            "RECEIVER_QUEUE": self.queue_name,
            "RECEIVER_CLOCK": lambda: unix(self.clock.now()),  # the same clock Promesa signs with
            "TESTING": True,
            **config,
        })
        self.front.app = self.app
        return self.app

    @property
    def ext(self):
        return self.app.extensions["promesa_receiver"]

    def queued(self) -> int:
        return self.ext.queue.count

    def work(self) -> int:
        """Run every queued job in this process; how many there were."""
        queued = self.queued()
        with self.app.app_context():
            BurstWorker([self.ext.queue], connection=self.ext.redis).work(burst=True)
        assert self.queued() == 0
        assert FailedJobRegistry(queue=self.ext.queue).count == 0, "a receiver job failed"
        return queued

    def cli(self, *args: str) -> str:
        # Push the receiver's context: the Promesa app's is current in these tests, and a
        # Flask command only pushes its own app when none is.
        with self.app.app_context():
            result = self.app.test_cli_runner().invoke(args=list(args))
        assert result.exit_code == 0, result.output
        return result.output.strip()

    def send(self, body: bytes, headers: dict) -> tuple[int, dict]:
        """A request that does not come from Promesa (an attacker, a replay from a capture)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("POST", PATH, body=body, headers={"Content-Type": "application/json", **headers})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read() or b"null")
        finally:
            conn.close()

    # -- the receiver's state ------------------------------------------------------------
    def _rows(self, table, key):
        with self.ext.storage.engine.connect() as conn:
            return {row[key]: row for row in conn.execute(sa.select(table)).mappings()}

    def inbox(self) -> dict:
        return self._rows(inbox, "event_id")

    def files(self) -> dict:
        return self._rows(files, "resource_id")

    def ordering_log(self) -> dict:
        """event id -> applied, from the SDK's received-events table."""
        rows = self._rows(self.ext.storage.ordering_store.events_table, "event_id")
        return {event_id: bool(row["applied"]) for event_id, row in rows.items()}

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        if self.app is None:
            return
        self.ext.storage.engine.dispose()
        conn = self.ext.redis
        for job_id in FailedJobRegistry(queue=self.ext.queue).get_job_ids():
            conn.delete(f"rq:job:{job_id}")
        self.ext.queue.delete(delete_jobs=True)
        keys = list(conn.scan_iter(match=f"*{self.queue_name}*", count=1000))
        if keys:
            conn.delete(*keys)
        conn.close()


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def receiver_postgres_url():
    """A database of the receiver's own (not Promesa's), created once per test process."""
    with fresh_postgres_database("promesa_receiver_test") as url:
        yield url


@pytest.fixture(params=[pytest.param("sqlite", id="receiver_sqlite"),
                        pytest.param("postgresql", id="receiver_postgresql", marks=pytest.mark.postgres)])
def receiver_database_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'receiver.db'}"
    url = request.getfixturevalue("receiver_postgres_url")
    engine = sa.create_engine(url)
    existing = sa.MetaData()
    existing.reflect(engine)
    existing.drop_all(engine)
    engine.dispose()
    return url


@pytest.fixture
def rx(app, receiver_database_url, redis_url, clock, monkeypatch):
    running = RunningReceiver(receiver_database_url, redis_url, clock, monkeypatch)
    yield running
    running.close()


# -- helpers ----------------------------------------------------------------------------------
def deliveries(producer, event_id) -> list[dict]:
    resp = producer.get(f"/api/v1/events/{event_id}")
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()["deliveries"]


def statuses(producer, event_id) -> list[list[int | None]]:
    """Per delivery of the event, the status code of each attempt Promesa made."""
    return [[a["status_code"] for a in d["attempts"]] for d in deliveries(producer, event_id)]


def file_event(producer, resource_id, version, event_type="file.updated") -> str:
    return producer.publish(event_type, {"resource_id": resource_id, "resource_version": version})["id"]


def retries_due(app, clock, seconds=30):
    """Move the frozen clock past the next retry (30 s with equal jitter) and deliver."""
    clock.advance(seconds=seconds)
    return deliver_due(app, clock)


# == 1. the normal path ==========================================================================
def test_events_are_stored_and_answered_200_then_applied_by_the_job(app, producer, clock, rx):
    sub = producer.subscribe(rx.url)
    rx.start(sub["secret"])
    e1 = file_event(producer, "f_1", 1)
    e2 = file_event(producer, "f_2", 5, "file.created")
    e3 = file_event(producer, "f_3", 2)
    other = producer.publish("project.archived", {"resource_id": "p_1"})["id"]

    deliver_due(app, clock)

    for event_id in (e1, e2, e3, other):
        [d] = deliveries(producer, event_id)
        assert d["state"] == "succeeded" and [a["status_code"] for a in d["attempts"]] == [200]
        assert '"accepted"' in d["attempts"][0]["response_excerpt"]
    # Answered before any work: every event is persisted, verified bytes and all; nothing applied yet.
    stored = rx.inbox()
    assert set(stored) == {e1, e2, e3, other}
    assert all(row["processed_at"] is None and row["times_received"] == 1 for row in stored.values())
    assert stored[e1]["signed_at"] == int(unix(clock.now()))
    assert stored[e1]["body"] == rx.front.from_promesa(e1)[0].body
    assert rx.files() == {} and rx.queued() == 4

    assert rx.work() == 4

    state = rx.files()
    assert {rid: (row["resource_version"], row["event_id"]) for rid, row in state.items()} == {
        "f_1": (1, e1), "f_2": (5, e2), "f_3": (2, e3)}
    outcomes = {event_id: row["outcome"] for event_id, row in rx.inbox().items()}
    assert outcomes == {e1: "applied", e2: "applied", e3: "applied", other: "ignored"}
    assert all(row["processed_at"] is not None for row in rx.inbox().values())
    assert set(rx.ordering_log()) == {e1, e2, e3, other}
    assert sorted(rx.applied) == sorted([e1, e2, e3])


# == 2. duplicates ===============================================================================
def test_a_lost_answer_brings_a_duplicate_which_is_answered_200_and_not_processed_again(app, producer, clock, rx):
    sub = producer.subscribe(rx.url)
    rx.start(sub["secret"])
    e1, e2, e3 = (file_event(producer, f"f_{i}", 1) for i in (1, 2, 3))
    rx.front.lose(e1)
    rx.front.lose(e2)

    deliver_due(app, clock)
    assert [d["state"] for d in deliveries(producer, e1)] == ["scheduled"]  # Promesa saw 502
    assert rx.work() == 3  # ... but the receiver had stored all three and enqueued their jobs
    assert sorted(rx.applied) == sorted([e1, e2, e3])

    retries_due(app, clock)  # Promesa retries e1 and e2: same id, same body

    for event_id in (e1, e2):
        first, again = rx.front.from_promesa(event_id)
        assert first.body == again.body and first.status == 502 and again.status == 200
        assert json.loads(again.answer) == {"status": "duplicate", "event_id": event_id}
        assert statuses(producer, event_id) == [[502, 200]]
        assert [d["state"] for d in deliveries(producer, event_id)] == ["succeeded"]
    assert rx.queued() == 0  # processed already: no job for a duplicate
    assert rx.work() == 0
    assert sorted(rx.applied) == sorted([e1, e2, e3])  # the work ran once per event id
    assert {k: row["times_received"] for k, row in rx.inbox().items()} == {e1: 2, e2: 2, e3: 1}
    assert {rid: row["resource_version"] for rid, row in rx.files().items()} == {"f_1": 1, "f_2": 1, "f_3": 1}


def test_a_duplicate_arriving_before_the_job_ran_is_enqueued_again_but_worked_once(app, producer, clock, rx):
    sub = producer.subscribe(rx.url)
    rx.start(sub["secret"])
    e1 = file_event(producer, "f_1", 4)
    rx.front.lose(e1)

    deliver_due(app, clock)
    retries_due(app, clock)  # the duplicate comes while the first job is still queued

    assert statuses(producer, e1) == [[502, 200]]
    assert rx.queued() == 2  # the duplicate's job cannot know the first one will succeed
    assert rx.work() == 2
    assert rx.applied == [e1]  # the second job found the event in the ordering log: nothing to do
    [row] = rx.inbox().values()
    assert row["times_received"] == 2 and row["outcome"] == "applied"
    assert rx.files()["f_1"]["resource_version"] == 4


def test_replayed_dead_letters_are_duplicates_answered_200(app, producer, clock, rx):
    """Every answer for one event is lost for the whole retry schedule (1.5 days): Promesa
    dead-letters it although the receiver did the work on the first try. The operator
    replays it: the receiver answers 200 and does not do the work again."""
    sub = producer.subscribe(rx.url)
    rx.start(sub["secret"])
    e1 = file_event(producer, "f_1", 1)
    e2 = file_event(producer, "f_2", 1)
    rx.front.lose(e1, times=8)

    deliver_due(app, clock)
    rx.work()
    for _ in range(7):
        clock.advance(hours=25)  # beyond the longest retry delay (24 h)
        deliver_due(app, clock)
    [dead] = deliveries(producer, e1)
    assert dead["state"] == "dead" and dead["attempt_count"] == 8
    assert rx.queued() == 0  # eight arrivals, one job: the first

    listed = producer.get(f"/api/v1/subscriptions/{sub['id']}/deliveries?state=dead").get_json()["data"]
    assert [d["id"] for d in listed] == [dead["id"]]
    resp = producer.post(f"/api/v1/subscriptions/{sub['id']}/replay", {"delivery_ids": [dead["id"]]})
    assert resp.status_code == 202 and resp.get_json()["replayed"] == 1
    deliver_due(app, clock)

    [d] = deliveries(producer, e1)
    assert d["state"] == "succeeded" and [a["status_code"] for a in d["attempts"]] == [502] * 8 + [200]
    assert json.loads(rx.front.from_promesa(e1)[-1].answer)["status"] == "duplicate"
    assert rx.work() == 0
    assert sorted(rx.applied) == sorted([e1, e2])
    assert rx.inbox()[e1]["times_received"] == 9


def test_two_subscriptions_to_one_endpoint_deliver_every_event_twice_at_once(app, producer, clock, rx):
    """Two subscriptions (two secrets) point at the same endpoint: each event id arrives twice,
    concurrently, and both claims race on the same primary key."""
    first = producer.subscribe(rx.url)
    second = producer.subscribe(rx.url, description="the same endpoint, added twice")
    rx.start(first["secret"], second["secret"])
    events = [file_event(producer, f"f_{i}", i) for i in range(1, 9)]

    deliver_due(app, clock)

    for event_id in events:
        assert statuses(producer, event_id) == [[200], [200]]
        answers = sorted(json.loads(s.answer)["status"] for s in rx.front.from_promesa(event_id))
        assert answers == ["accepted", "duplicate"]
    assert {k: row["times_received"] for k, row in rx.inbox().items()} == {e: 2 for e in events}
    assert rx.work() >= len(events)  # a duplicate that beat its first job enqueues one more
    assert sorted(rx.applied) == sorted(events)
    assert {rid: row["resource_version"] for rid, row in rx.files().items()} == {f"f_{i}": i for i in range(1, 9)}


# == 3. order ====================================================================================
def test_a_lower_version_published_after_a_higher_one_is_stored_but_not_applied(app, producer, clock, rx):
    sub = producer.subscribe(rx.url)
    rx.start(sub["secret"])
    v3 = file_event(producer, "f_1", 3)
    deliver_due(app, clock)
    v2 = file_event(producer, "f_1", 2)
    deliver_due(app, clock)
    assert statuses(producer, v3) == statuses(producer, v2) == [[200]]  # stale is answered 200 too

    assert rx.work() == 2

    [f] = rx.files().values()
    assert (f["resource_id"], f["resource_version"], f["event_id"]) == ("f_1", 3, v3)
    stored = rx.inbox()
    assert set(stored) == {v3, v2}  # both persisted
    assert (stored[v3]["outcome"], stored[v2]["outcome"]) == ("applied", "stale")
    assert rx.ordering_log() == {v3: True, v2: False}
    assert rx.applied == [v3]


def test_an_older_version_retried_after_a_newer_one_arrives_stale(app, producer, clock, rx):
    """The contract's ORDER line: v1 fails once and is retried while v2 gets through."""
    sub = producer.subscribe(rx.url)
    rx.start(sub["secret"])
    v1 = file_event(producer, "f_1", 1)
    rx.front.down(v1)  # v1's first attempt never reaches the receiver
    deliver_due(app, clock)
    assert v1 not in rx.inbox()
    v2 = file_event(producer, "f_1", 2)
    deliver_due(app, clock)
    rx.work()
    assert rx.files()["f_1"]["resource_version"] == 2

    retries_due(app, clock)  # v1 arrives now, after v2
    assert statuses(producer, v1) == [[503, 200]]
    rx.work()

    assert rx.files()["f_1"]["resource_version"] == 2 and rx.files()["f_1"]["event_id"] == v2
    assert {k: row["outcome"] for k, row in rx.inbox().items()} == {v1: "stale", v2: "applied"}
    assert rx.ordering_log() == {v1: False, v2: True}
    assert rx.applied == [v2]


# == 4. authenticity =============================================================================
def test_forged_tampered_or_reserialised_requests_get_400_and_store_nothing(app, producer, clock, rx):
    sub = producer.subscribe(rx.url)
    rx.start(sub["secret"])
    genuine = file_event(producer, "f_1", 1)
    deliver_due(app, clock)
    [seen] = rx.front.from_promesa(genuine)
    body, signature = seen.body, seen.headers["X-Signature"]
    now = int(unix(clock.now()))
    before = rx.inbox()

    forged_body = json.dumps({"id": "evt_forged", "type": "file.updated", "version": 1,
                              "timestamp": "2030-01-01T00:00:00.000Z",
                              "data": {"resource_id": "f_1", "resource_version": 99}}).encode()
    attempts = {
        "tampered body, genuine signature": (body.replace(b'"resource_version":1', b'"resource_version":99'),
                                             {"X-Signature": signature}),
        "tampered id, genuine signature": (body.replace(genuine.encode(), b"evt_tampered"), {"X-Signature": signature}),
        "re-serialised JSON, genuine signature": (json.dumps(json.loads(body)).encode(), {"X-Signature": signature}),
        "forged with another secret": (forged_body, {"X-Signature": promesa_header(new_secret(), now, forged_body)}),
        "no signature": (forged_body, {}),
        "garbled signature": (forged_body, {"X-Signature": "t=now,v1=please"}),
        "a Standard Webhooks signature": (forged_body, standard_headers(sub["secret"], "evt_forged", now, forged_body)),
    }
    for what, (payload, headers) in attempts.items():
        status, answer = rx.send(payload, headers)
        assert status == 400, what
        assert answer["error"].startswith("signature rejected: "), (what, answer)

    # Genuinely signed, but not an event: still a 400, never a 500.
    for payload in (b"not json", b"[1, 2]", b'{"type": "file.updated"}'):
        status, answer = rx.send(payload, {"X-Signature": promesa_header(sub["secret"], now, payload)})
        assert status == 400 and answer["error"].startswith("not a Promesa event: "), payload

    assert rx.inbox() == before  # nothing stored, nothing counted
    assert rx.queued() == 1  # the genuine event's job only
    rx.work()
    assert rx.applied == [genuine] and rx.files()["f_1"]["resource_version"] == 1
    assert set(rx.ordering_log()) == {genuine}


def test_a_secret_the_receiver_does_not_know_is_refused_then_replayed_after_the_fix(app, producer, clock, rx):
    """Deployed with the wrong secret: Promesa's deliveries get 400 (with the reason in the
    attempt log) and are dead-lettered after three; nothing is stored. With the right secret
    added, the operator's replay goes through."""
    sub = producer.subscribe(rx.url)
    rx.start(new_secret())
    e1 = file_event(producer, "f_1", 7)
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(hours=1)

    [d] = deliveries(producer, e1)
    assert d["state"] == "dead" and [a["status_code"] for a in d["attempts"]] == [400, 400, 400]
    assert "signature rejected" in d["attempts"][0]["response_excerpt"]
    assert rx.inbox() == {} and rx.queued() == 0

    rx.app.config["PROMESA_WEBHOOK_SECRETS"].append(sub["secret"])  # the fix, as a redeploy would do
    resp = producer.post(f"/api/v1/subscriptions/{sub['id']}/replay")
    assert resp.status_code == 202 and resp.get_json()["replayed"] == 1
    deliver_due(app, clock)

    assert [d["state"] for d in deliveries(producer, e1)] == ["succeeded"]
    rx.work()
    assert rx.files()["f_1"]["resource_version"] == 7 and rx.applied == [e1]


# == 5. freshness ================================================================================
def test_a_captured_request_replayed_later_is_refused_as_stale(app, producer, clock, rx):
    sub = producer.subscribe(rx.url)
    rx.start(sub["secret"])
    e1 = file_event(producer, "f_1", 1)
    deliver_due(app, clock)
    rx.work()
    [seen] = rx.front.from_promesa(e1)
    captured = (seen.body, {"X-Signature": seen.headers["X-Signature"]})

    clock.advance(seconds=299)  # inside the window: the same bytes are just a duplicate
    assert rx.send(*captured) == (200, {"status": "duplicate", "event_id": e1})
    clock.advance(seconds=2)  # 301 s after signing: an attacker's replay
    status, answer = rx.send(*captured)
    assert status == 400 and "in the past" in answer["error"]

    # A new event, rightly signed, but with a timestamp outside the window either way.
    now = int(unix(clock.now()))
    body = json.dumps({"id": "evt_late", "type": "file.updated", "version": 1, "timestamp": "2030-01-01T00:00:00.000Z",
                       "data": {"resource_id": "f_1", "resource_version": 2}}).encode()
    for t, words in ((now - 301, "in the past"), (now + 301, "in the future")):
        status, answer = rx.send(body, {"X-Signature": promesa_header(sub["secret"], t, body)})
        assert status == 400 and words in answer["error"]

    assert set(rx.inbox()) == {e1} and rx.inbox()[e1]["times_received"] == 2
    assert rx.queued() == 0
    assert rx.files()["f_1"]["resource_version"] == 1 and rx.applied == [e1]


# == failures of the receiver's own parts ========================================================
def test_when_the_job_queue_is_down_the_event_is_kept_and_the_retry_enqueues_it(app, producer, clock, rx,
                                                                              monkeypatch):
    sub = producer.subscribe(rx.url)
    rx.start(sub["secret"])
    queue = rx.ext.queue
    real_enqueue = queue.enqueue
    failures = []

    def enqueue_with_redis_down_once(*args, **kwargs):
        if not failures:
            failures.append(args)
            raise redis.ConnectionError("Redis is restarting")
        return real_enqueue(*args, **kwargs)

    monkeypatch.setattr(queue, "enqueue", enqueue_with_redis_down_once)
    e1 = file_event(producer, "f_1", 3)

    deliver_due(app, clock)
    assert statuses(producer, e1) == [[503]]
    assert rx.inbox()[e1]["processed_at"] is None and rx.queued() == 0  # kept, not yet worked

    retries_due(app, clock)
    assert statuses(producer, e1) == [[503, 200]]
    assert rx.work() == 1
    assert rx.applied == [e1] and rx.inbox()[e1]["outcome"] == "applied"


def test_requeue_rebuilds_lost_jobs_from_the_inbox(app, producer, clock, rx):
    sub = producer.subscribe(rx.url)
    rx.start(sub["secret"])
    events = [file_event(producer, f"f_{i}", 1) for i in range(3)]
    deliver_due(app, clock)
    assert rx.queued() == 3
    rx.ext.queue.empty()  # Redis lost its data; the inbox (the database) did not

    assert rx.cli("requeue") == "re-enqueued 3 event(s)"
    assert rx.work() == 3
    assert sorted(rx.applied) == sorted(events)
    assert rx.cli("requeue") == "re-enqueued 0 event(s)"


# == the other signature scheme ==================================================================
def test_a_standard_webhooks_subscription(app, producer, clock, rx):
    sub = producer.subscribe(rx.url, signature_scheme="standard-webhooks")
    rx.start(sub["secret"], PROMESA_SIGNATURE_SCHEME="standard-webhooks")
    e1 = file_event(producer, "f_1", 2)
    deliver_due(app, clock)
    assert statuses(producer, e1) == [[200]]
    rx.work()
    assert rx.files()["f_1"]["resource_version"] == 2

    # This receiver expects the Standard Webhooks headers: an X-Signature alone is refused.
    [seen] = rx.front.from_promesa(e1)
    now = int(unix(clock.now()))
    status, answer = rx.send(seen.body, {"X-Signature": promesa_header(sub["secret"], now, seen.body)})
    assert status == 400 and "webhook-signature" in answer["error"]


# == configuration =============================================================================
def test_the_receiver_refuses_to_start_without_a_secret_or_with_an_unknown_scheme(database_url, tmp_path):
    # (database_url only because this module pins Promesa to SQLite; no Promesa here)
    base = {"RECEIVER_DATABASE_URL": f"sqlite:///{tmp_path / 'r.db'}", "RECEIVER_REDIS_URL": "redis://unused"}
    with pytest.raises(RuntimeError, match="PROMESA_WEBHOOK_SECRETS"):
        create_receiver_app({**base, "PROMESA_WEBHOOK_SECRETS": []})
    with pytest.raises(RuntimeError, match="PROMESA_SIGNATURE_SCHEME"):
        create_receiver_app({**base, "PROMESA_WEBHOOK_SECRETS": "whsec_a", "PROMESA_SIGNATURE_SCHEME": "md5"})
    app = create_receiver_app({**base, "PROMESA_WEBHOOK_SECRETS": " whsec_a, whsec_b "})
    assert app.config["PROMESA_WEBHOOK_SECRETS"] == ["whsec_a", "whsec_b"]
