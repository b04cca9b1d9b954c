"""The producer client against the real service on a loopback port: delivered, idempotent, retried
only when an answer may change, and spooled to SQLite when the service cannot be reached."""

from __future__ import annotations

import email.utils
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import promesa_producer
import pytest
import sqlalchemy as sa
from promesa_producer import AuthError, Client, Rejected, Unavailable

from dashboard.core.extensions import db
from dashboard.models import Event

from .producer_fixtures import live_url, proxy, refused_url, sleeps  # noqa: F401  (fixtures)

SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def stored(team) -> list[Event]:
    """The team's events as the service's database holds them, oldest first."""
    db.session.rollback()  # read what the server's threads committed, not this session's snapshot
    return list(db.session.scalars(sa.select(Event).where(Event.team_id == team.id).order_by(Event.created_at,
                                                                                           Event.key)))


def ids_sent(proxy) -> list[str]:
    """The event ids in every request the proxy saw, in order (a batch contributes each of its events)."""
    out = []
    for seen in proxy.seen:
        body = json.loads(seen.body)
        out += [e["id"] for e in body.get("events", [body])]
    return out


class MostJitter(random.Random):
    """Full jitter that always picks the top of its range, so the backoff's bound is what is recorded."""

    def uniform(self, a, b):
        return b


# -- delivered -----------------------------------------------------------------------------------

def test_publish_is_stored_with_an_id_made_by_the_client(live_url, producer, receiver, sleeps):
    producer.subscribe(receiver.url + "/hook", event_types=["file.*"])
    result = Client(live_url, producer.token, sleep=sleeps).publish("file.updated", {"resource_id": "f_1"})
    assert result.id.startswith("pub_") and result.deliveries == 1 and not result.duplicate and not result.spooled
    [event] = stored(producer.team)
    assert (event.id, event.type, event.data) == (result.id, "file.updated", {"resource_id": "f_1"})
    assert sleeps == []


def test_the_same_id_twice_is_one_event(live_url, producer, sleeps):
    client = Client(live_url, producer.token, sleep=sleeps)
    first = client.publish("order.paid", {"resource_id": "o_1"}, id="order-1")
    again = client.publish("order.paid", {"resource_id": "o_1"}, id="order-1")
    assert (first.id, first.duplicate, again.id, again.duplicate) == ("order-1", False, "order-1", True)
    assert [e.id for e in stored(producer.team)] == ["order-1"]


def test_publish_many_splits_at_the_services_batch_limit(proxy, producer, sleeps):
    events = [{"type": "file.updated", "data": {"resource_id": f"f_{i}"}} for i in range(501)]
    results = Client(proxy.url, producer.token, sleep=sleeps).publish_many(events)
    assert [len(json.loads(s.body)["events"]) for s in proxy.seen] == [500, 1]
    assert [s.answered for s in proxy.seen] == [202, 202]
    assert len({r.id for r in results}) == 501 and not any(r.duplicate or r.spooled for r in results)
    by_id = {e.id: e.data["resource_id"] for e in stored(producer.team)}
    assert [by_id[r.id] for r in results] == [f"f_{i}" for i in range(501)]


@SQLITE_ONLY
def test_publish_many_splits_by_bytes_too(proxy, producer, sleeps):
    events = [{"type": "file.updated", "data": {"resource_id": f"f_{i}", "pad": "x" * 300}} for i in range(6)]
    Client(proxy.url, producer.token, sleep=sleeps, max_batch_bytes=1000).publish_many(events)
    assert [len(json.loads(s.body)["events"]) for s in proxy.seen] == [2, 2, 2]
    assert all(len(s.body) < 1000 for s in proxy.seen)
    assert len(stored(producer.team)) == 6


# -- retries -------------------------------------------------------------------------------------

@SQLITE_ONLY
def test_a_lost_answer_is_retried_and_finds_the_first_copy(proxy, producer, sleeps):
    proxy.script = ["pass then drop"]  # the service stores the event; its answer never arrives
    result = Client(proxy.url, producer.token, sleep=sleeps).publish("file.updated", {"resource_id": "f_1"})
    assert result.duplicate and len(sleeps) == 1
    assert [s.answered for s in proxy.seen] == [None, 202]
    assert ids_sent(proxy) == [result.id, result.id]
    assert [e.id for e in stored(producer.team)] == [result.id]


@SQLITE_ONLY
def test_a_lost_batch_answer_is_retried_without_duplicates(proxy, producer, sleeps):
    proxy.script = ["pass then drop"]
    events = [{"type": "file.updated", "data": {"resource_id": f"f_{i}"}} for i in range(3)]
    results = Client(proxy.url, producer.token, sleep=sleeps).publish_many(events)
    assert [r.duplicate for r in results] == [True, True, True]
    assert sorted(e.id for e in stored(producer.team)) == sorted(r.id for r in results)


@SQLITE_ONLY
def test_503_and_429_are_retried_no_sooner_than_retry_after(proxy, producer, sleeps):
    proxy.script = [(503, {"Retry-After": "7"}), (429, {"Retry-After": "3"})]
    result = Client(proxy.url, producer.token, sleep=sleeps).publish("file.updated", {"resource_id": "f_1"})
    assert sleeps == [7.0, 3.0]
    assert [s.answered for s in proxy.seen] == [503, 429, 202]
    assert ids_sent(proxy) == [result.id] * 3
    assert [e.id for e in stored(producer.team)] == [result.id]


@SQLITE_ONLY
def test_a_service_stuck_on_its_database_is_timed_out_and_retried_into_one_event(live_url, producer, database_url,
                                                                                 sleeps):
    """A real failure of the service itself: another writer holds its SQLite file, the request waits on the
    lock past the client's timeout, and the lock goes at the client's first backoff. Both requests then
    reach the database; the event id makes them one event."""
    locker = sqlite3.connect(database_url.removeprefix("sqlite:///"), isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")

    def sleep_then_unlock(seconds):
        sleeps(seconds)
        if locker.in_transaction:
            locker.execute("ROLLBACK")

    try:
        result = Client(live_url, producer.token, timeout=1.0, sleep=sleep_then_unlock).publish("file.updated", {})
    finally:
        locker.close()
    assert len(sleeps) == 1
    assert [e.id for e in stored(producer.team)] == [result.id]


@SQLITE_ONLY
def test_retry_after_as_an_http_date_is_read_on_the_clients_clock(proxy, producer, sleeps):
    now = 1_800_000_000.0
    proxy.script = [(503, {"Retry-After": email.utils.formatdate(now + 12, usegmt=True)})]
    Client(proxy.url, producer.token, sleep=sleeps, clock=lambda: now).publish("file.updated", {})
    assert sleeps == [12.0]


@SQLITE_ONLY
def test_without_retry_after_the_backoff_doubles_up_to_its_cap(proxy, producer, sleeps):
    proxy.script = [(503, {}), (502, {}), (500, {}), (504, {})]
    client = Client(proxy.url, producer.token, sleep=sleeps, backoff=0.5, max_backoff=1.5, rng=MostJitter())
    client.publish("file.updated", {})
    assert sleeps == [0.5, 1.0, 1.5, 1.5]
    assert len(stored(producer.team)) == 1


@SQLITE_ONLY
def test_full_jitter_stays_inside_the_backoff(proxy, producer, sleeps):
    proxy.script = [(503, {})] * 5
    Client(proxy.url, producer.token, sleep=sleeps, backoff=1.0, rng=random.Random(31)).publish("file.updated", {})
    assert len(sleeps) == 5 and all(0 <= s <= 2 ** n for n, s in enumerate(sleeps))
    assert len(set(sleeps)) == 5  # drawn, not fixed


@SQLITE_ONLY
def test_a_retry_after_longer_than_allowed_ends_the_retries(proxy, producer, sleeps):
    proxy.script = [(503, {"Retry-After": "3600"})]
    with pytest.raises(Unavailable) as caught:
        Client(proxy.url, producer.token, sleep=sleeps, max_retry_after=60).publish("file.updated", {})
    assert sleeps == [] and caught.value.attempts == 1 and len(proxy.seen) == 1


@SQLITE_ONLY
def test_unavailable_after_the_retries_names_the_id_to_publish_again(proxy, producer, sleeps):
    proxy.script = [(503, {})] * 3
    with pytest.raises(Unavailable) as caught:
        Client(proxy.url, producer.token, sleep=sleeps, retries=2).publish("file.updated", {}, id="again-1")
    assert (caught.value.attempts, caught.value.status, caught.value.ids) == (3, 503, ["again-1"])
    assert len(sleeps) == 2 and stored(producer.team) == []


@SQLITE_ONLY
@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 415, 422, 501, 307])
def test_an_answer_that_will_not_change_is_not_retried(proxy, producer, sleeps, status):
    proxy.script = [(status, {"Retry-After": "1", "Location": proxy.url + "/api/v1/events"})]
    with pytest.raises(Rejected) as caught:
        Client(proxy.url, producer.token, sleep=sleeps).publish("file.updated", {})
    assert caught.value.status == status and isinstance(caught.value, AuthError) == (status in (401, 403))
    assert len(proxy.seen) == 1 and sleeps == [] and stored(producer.team) == []


@SQLITE_ONLY
def test_a_batchs_409_is_a_race_on_its_ids_and_is_sent_again(proxy, producer, sleeps):
    proxy.script = [(409, {})]  # the service's own words: "send the batch again"
    events = [{"type": "file.updated", "data": {"resource_id": f"f_{i}"}} for i in range(2)]
    results = Client(proxy.url, producer.token, sleep=sleeps).publish_many(events)
    assert [s.answered for s in proxy.seen] == [409, 202] and len(sleeps) == 1
    assert sorted(e.id for e in stored(producer.team)) == sorted(r.id for r in results)


@SQLITE_ONLY
def test_the_services_own_refusals_are_typed_and_not_retried(proxy, producer, sleeps):
    client = Client(proxy.url, producer.token, sleep=sleeps)
    with pytest.raises(Rejected) as too_big:
        client.publish("file.updated", {"blob": "x" * 9000})
    assert too_big.value.status == 413 and "cap" in too_big.value.error
    with pytest.raises(Rejected) as bad_type:
        client.publish("not a type!", {})
    assert bad_type.value.status in (400, 422) and "type" in bad_type.value.error
    with pytest.raises(AuthError) as bad_token:
        Client(proxy.url, "not-a-token", sleep=sleeps).publish("file.updated", {})
    assert bad_token.value.status == 401
    assert len(proxy.seen) == 3 and sleeps == [] and stored(producer.team) == []


@SQLITE_ONLY
def test_a_refused_batch_names_the_event_in_the_whole_list(proxy, producer, sleeps):
    events = [{"type": "file.updated", "data": {"resource_id": f"f_{i}"}} for i in range(5)]
    events[3]["data"] = {"blob": "x" * 9000}
    with pytest.raises(Rejected) as caught:
        Client(proxy.url, producer.token, sleep=sleeps, max_batch=2).publish_many(events)
    assert caught.value.index == 3 and caught.value.status == 413
    assert len(caught.value.published) == 2  # the first batch went through; the second was refused whole
    assert len(stored(producer.team)) == 2 and len(proxy.seen) == 2


def test_connection_refused_is_retried_then_unavailable(refused_url, sleeps):
    with pytest.raises(Unavailable) as caught:
        Client(refused_url, "tok", sleep=sleeps, retries=3).publish("file.updated", {})
    assert caught.value.attempts == 4 and caught.value.status is None and "Refused" in caught.value.cause
    assert len(sleeps) == 3


def test_a_service_that_never_answers_times_out_and_is_retried(sleeps):
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(Unavailable) as caught:
            Client(url, "tok", sleep=sleeps, retries=1, timeout=0.2).publish("file.updated", {})
    assert caught.value.attempts == 2 and "timed out" in caught.value.cause.lower()
    assert len(sleeps) == 1


# -- the spool -----------------------------------------------------------------------------------

@SQLITE_ONLY
def test_connection_refused_goes_to_the_spool_and_a_new_client_flushes_it(refused_url, live_url, producer, tmp_path,
                                                                          sleeps):
    spool = tmp_path / "spool.db"
    down = Client(refused_url, producer.token, sleep=sleeps, retries=1, spool=spool,
                  clock=lambda: 1_800_000_000.0)
    first = down.publish("file.updated", {"resource_id": "f_1"})
    rest = down.publish_many([{"type": "file.updated", "data": {"resource_id": f"f_{i}"}} for i in (2, 3)])
    assert first.spooled and first.deliveries is None and all(r.spooled for r in rest)
    assert down.spool.pending() == 3 and stored(producer.team) == []
    del down  # the producer restarts: a new client on the same file

    up = Client(live_url, producer.token, sleep=sleeps, spool=spool)
    flushed = up.flush()
    assert [p.id for p in flushed.published] == [first.id] + [r.id for r in rest]
    assert flushed.rejected == [] and up.spool.pending() == 0
    events = {e.id: e for e in stored(producer.team)}
    assert [events[p.id].data["resource_id"] for p in flushed.published] == ["f_1", "f_2", "f_3"]
    # When it was published, not when the flush sent it.
    assert all(e.occurred_at.year == 2027 for e in events.values())
    assert up.flush().published == []


KILLED_PRODUCER = """
import json, os, signal, sys
from promesa_producer import Client
url, token, spool = sys.argv[1:]
client = Client(url, token, retries=1, backoff=0.01, spool=spool)
ids = [client.publish("file.updated", {"resource_id": f"f_{i}"}).id for i in range(3)]
print(json.dumps(ids), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no clean exit: what the spool holds is all that is left
"""


@SQLITE_ONLY
def test_a_killed_producer_process_loses_nothing(refused_url, live_url, producer, tmp_path, sleeps):
    spool = tmp_path / "spool.db"
    env = {**os.environ, "PYTHONPATH": str(Path(promesa_producer.__file__).parents[1])}
    child = subprocess.run([sys.executable, "-c", KILLED_PRODUCER, refused_url, producer.token, str(spool)],
                           capture_output=True, text=True, env=env, timeout=60, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    ids = json.loads(child.stdout)
    flushed = Client(live_url, producer.token, sleep=sleeps, spool=spool).flush()
    assert [p.id for p in flushed.published] == ids
    assert sorted(e.id for e in stored(producer.team)) == sorted(ids)


@SQLITE_ONLY
def test_a_flush_keeps_what_the_service_did_not_accept(proxy, producer, tmp_path, sleeps):
    spool = tmp_path / "spool.db"
    proxy.script = [(503, {})] * 2
    client = Client(proxy.url, producer.token, sleep=sleeps, retries=1, spool=spool)
    kept = client.publish("file.updated", {"resource_id": "f_1"})
    assert kept.spooled and client.spool.pending() == 1
    proxy.script = [(503, {"Retry-After": "1"})] * 2
    with pytest.raises(Unavailable):
        client.flush()
    assert client.spool.pending() == 1 and stored(producer.team) == []
    assert [p.id for p in client.flush().published] == [kept.id]
    assert client.spool.pending() == 0 and [e.id for e in stored(producer.team)] == [kept.id]


@SQLITE_ONLY
def test_an_event_refused_at_flush_is_set_aside_and_the_rest_go_through(refused_url, live_url, producer, tmp_path,
                                                                        sleeps):
    spool = tmp_path / "spool.db"
    events = [{"type": "file.updated", "data": {"resource_id": f"f_{i}"}} for i in range(4)]
    events[2]["data"] = {"blob": "x" * 9000}  # over the service's 8 KB cap: refused however often it is sent
    Client(refused_url, producer.token, sleep=sleeps, retries=0, spool=spool).publish_many(events)
    client = Client(live_url, producer.token, sleep=sleeps, spool=spool)
    flushed = client.flush()
    assert [r.status for r in flushed.rejected] == [413]
    assert sorted(e.data["resource_id"] for e in stored(producer.team)) == ["f_0", "f_1", "f_3"]
    [aside] = client.spool.rejected()
    assert aside.event["data"] == {"blob": "x" * 9000} and "cap" in aside.rejected
    assert client.spool.pending() == 0 and client.flush().published == []


def test_a_spooled_event_with_nul_is_set_aside_and_later_ones_still_go(refused_url, live_url, producer, tmp_path,
                                                                      sleeps):
    # PostgreSQL refused NUL with a 500, so the flush retried the batch holding it for ever.
    spool = tmp_path / "spool.db"
    events = [{"type": "file.updated", "data": {"resource_id": rid}} for rid in ("f_0", "a\u0000b", "f_2")]
    Client(refused_url, producer.token, sleep=sleeps, retries=0, spool=spool).publish_many(events)
    client = Client(live_url, producer.token, sleep=sleeps, retries=1, spool=spool)
    flushed = client.flush()
    assert [r.status for r in flushed.rejected] == [422]
    [aside] = client.spool.rejected()
    assert aside.event["data"] == {"resource_id": "a\u0000b"} and "data.resource_id" in aside.rejected
    client.spool.add([{"type": "file.updated", "id": "later", "data": {"resource_id": "f_3"}}])
    assert [p.id for p in client.flush().published] == ["later"]
    assert sorted(e.data["resource_id"] for e in stored(producer.team)) == ["f_0", "f_2", "f_3"]
    assert client.spool.pending() == 0 and len(client.spool.rejected()) == 1


def test_the_spool_file_is_readable_by_its_owner_alone(refused_url, tmp_path, sleeps):
    spool = tmp_path / "spool.db"
    old = os.umask(0o022)  # the usual umask, which leaves new files readable by everyone
    try:
        Client(refused_url, "pk_x", sleep=sleeps, retries=0, spool=spool).publish("file.updated", {})
        reader = sqlite3.connect(spool)  # while a connection is open, SQLite keeps its -wal and -shm files
        try:
            assert reader.execute("SELECT count(*) FROM spooled_events").fetchone() == (1,)
            for path in (spool, Path(f"{spool}-wal"), Path(f"{spool}-shm")):
                assert path.stat().st_mode & 0o777 == 0o600, path
        finally:
            reader.close()
    finally:
        os.umask(old)


def too_deep(levels: int = 40) -> dict:
    """Small data the service refuses for good: nested deeper than it allows."""
    data: dict = {}
    for _ in range(levels):
        data = {"a": data}
    return data


@SQLITE_ONLY
def test_after_a_refused_event_the_flush_still_goes_oldest_first(refused_url, proxy, producer, tmp_path, sleeps):
    spool = tmp_path / "spool.db"
    events = [{"type": "file.updated", "data": too_deep()}] + [
        {"type": "file.updated", "data": {"resource_id": f"f_{i}", "pad": "x" * 200}} for i in (1, 2, 3)]
    Client(refused_url, producer.token, sleep=sleeps, retries=0, spool=spool).publish_many(events)
    flushed = Client(proxy.url, producer.token, sleep=sleeps, spool=spool, max_batch_bytes=800).flush()
    # [0, 1] refused for 0, 0 alone refused, then a new claim: [1, 2] and [3], never 2 and 3 before 1.
    assert [(len(json.loads(s.body)["events"]), s.answered) for s in proxy.seen] == [(2, 422), (1, 422), (2, 202),
                                                                                     (1, 202)]
    assert [r.status for r in flushed.rejected] == [422]
    by_id = {e.id: e.data["resource_id"] for e in stored(producer.team)}
    assert [by_id[p.id] for p in flushed.published] == ["f_1", "f_2", "f_3"]


@SQLITE_ONLY
def test_an_auth_error_at_flush_keeps_every_event(refused_url, live_url, producer, tmp_path, sleeps):
    spool = tmp_path / "spool.db"
    Client(refused_url, "wrong", sleep=sleeps, retries=0, spool=spool).publish("file.updated", {})
    with pytest.raises(AuthError):
        Client(live_url, "wrong", sleep=sleeps, spool=spool).flush()
    flushed = Client(live_url, producer.token, sleep=sleeps, spool=spool).flush()
    assert len(flushed.published) == 1 and len(stored(producer.team)) == 1


@SQLITE_ONLY
def test_two_clients_flushing_one_spool_send_each_event_once(refused_url, proxy, producer, tmp_path, sleeps):
    spool = tmp_path / "spool.db"
    down = Client(refused_url, producer.token, sleep=sleeps, retries=0, spool=spool)
    for i in range(40):
        down.publish("file.updated", {"resource_id": f"f_{i}"})
    flushers = [Client(proxy.url, producer.token, sleep=sleeps, spool=spool, max_batch=3) for _ in range(2)]
    done, errors = [], []

    def flush(client):
        try:
            done.append(client.flush())
        except Exception as exc:  # noqa: BLE001  (reported by the assertion below)
            errors.append(exc)

    threads = [threading.Thread(target=flush, args=(c,)) for c in flushers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    sent = ids_sent(proxy)
    assert len(sent) == len(set(sent)) == 40  # claimed rows are never sent by the other flusher
    assert sum(len(d.published) for d in done) == 40 and flushers[0].spool.pending() == 0
    assert len(stored(producer.team)) == 40
