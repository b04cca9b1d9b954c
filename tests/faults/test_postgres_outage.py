"""PostgreSQL away for 20 s (a restart or a managed failover) under `promesa up`, on a PostgreSQL of the
test's own: events are published throughout, by the producer client and by raw POSTs, while the workers
deliver to a loopback receiver. Afterwards every event handed over is delivered, ingest answered 503
with Retry-After and never 500, the workers and the sweeper are alive (and beating), and the
duplicates are counted and within what was in flight."""

from __future__ import annotations

import re
import threading
import time

import pytest
import redis
import sqlalchemy as sa

from ..conftest import IN_CI, Producer, _migrate
from ..support.private_postgres import PrivatePostgres, postgres_bin_dir
from ..support.publishing import ClientPublisher, RawPublisher
from ..support.receiver import Receiver
from ..support.waiting import wait_until
from .conftest import UP_BEATS, Stack, beating, close_the_books, counting_app, query, report, unsettled

try:
    import promesa_producer
except ImportError:  # the client is its own distribution (sdk/producer); without it, raw POSTs only
    promesa_producer = None

pytestmark = pytest.mark.slow

OUTAGE_SECONDS = 20
# Requests one worker keeps in flight to one endpoint, times the two workers of `promesa up`.
IN_FLIGHT_PER_ENDPOINT = 8 * 2
LEASE_SECONDS = 10


@pytest.fixture
def private_postgres():
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        if IN_CI:
            pytest.fail("CI=true and no initdb (Debian's postgresql package): this fault test needs it")
        pytest.skip("no initdb found (install Debian's postgresql package): a private PostgreSQL is needed")
    server = PrivatePostgres(bin_dir)
    server.init()
    server.start()
    yield server
    server.destroy()


@pytest.fixture
def outage_app(private_postgres, private_redis, tmp_path):
    admin = sa.create_engine(private_postgres.admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text("CREATE DATABASE promesa"))
    admin.dispose()
    url = private_postgres.url("promesa")
    _migrate(url)
    with counting_app(url, private_redis.url, tmp_path / "instance", "pgout", LEASE_SECONDS) as app:
        yield app


def test_postgres_away_for_20_seconds(outage_app, private_postgres, private_redis, tmp_path):
    with Receiver() as receiver:
        producer = Producer(outage_app.test_client(), "pgout")
        # Each request takes a second: when the database goes, both workers have their fill on the wire.
        producer.subscribe(receiver.url + "/slow/1")
        stack = Stack(outage_app, tmp_path / "promesa-up.log")
        stack.env["PROMESA_LEASE_SECONDS"] = str(LEASE_SECONDS)
        try:
            stack.start()
            children = stack.children()
            before, answers = stack.publish(producer.token, 60)
            assert answers == {202: 60}

            stop = threading.Event()
            raw = RawPublisher(stack.url, producer.token, stop)
            publishers = [raw]
            client = None
            if promesa_producer is not None:
                client = ClientPublisher(stack.url, producer.token, str(tmp_path / "spool.db"), stop)
                publishers.append(client)
            for p in publishers:
                p.start()
            assert wait_until(lambda: len(receiver.requests) >= 4, timeout=10)  # deliveries on the wire
            private_postgres.stop("fast")
            down_at = time.monotonic()
            time.sleep(OUTAGE_SECONDS)
            private_postgres.start()
            back_after = time.monotonic() - down_at
            time.sleep(3.0)  # and publishing goes on a moment after it is back
            stop.set()
            for p in publishers:
                p.join(60)
                assert not p.is_alive()

            handed = list(before) + raw.accepted
            if client is not None:
                handed += client.flush()  # with what the client spooled during the outage
            assert wait_until(lambda: unsettled() == 0, timeout=90), unsettled()
            assert stack.process.poll() is None and stack.children() == children  # nobody died or was restarted

            # Ingest answered 503 with Retry-After while the database was away, and never 500.
            assert raw.answers[503] > 0, raw.answers
            if 500 in raw.answers:
                log = stack.log()
                at = log.find("Traceback")
                pytest.fail(f"ingest answered 500: {raw.answers}\n{log[max(0, at - 3000):at + 12000]}", pytrace=False)
            assert all(value and value.isdigit() for value in raw.retry_after), raw.retry_after

            # The workers and the sweeper beat (they are alive, and say so to `promesa status`).
            beats = beating(redis.Redis(unix_socket_path=str(private_redis.socket)), "pgout")
            assert beats == UP_BEATS, beats

            figures = close_the_books(handed, receiver, in_flight_bound=IN_FLIGHT_PER_ENDPOINT)
            # Requests on the wire when it went were recorded once it was back (else sent again, and counted).
            recorded = query("SELECT count(*) FROM attempts")[0][0]
            figures["sent_but_unrecorded"] = len(receiver.requests) - recorded
            assert 0 <= figures["sent_but_unrecorded"] <= figures["duplicates"], figures
            log = stack.log()
            figures.update(outage_seconds=round(back_after, 1), answered_503=raw.answers[503],
                           answered_500=raw.answers.get(500, 0),
                           client_events=client.given if client else None,
                           client_spooled=client.spooled if client else None,
                           down_lines=len(re.findall("the database is unreachable", log)),
                           back_lines=len(re.findall("the database is back", log)),
                           tracebacks=log.count("Traceback (most recent call last)"))
            report("postgres down 20 s during ingest and delivery", figures)
            # One line per process and state change, not one per try: web (2 gunicorn workers), 2 workers,
            # the sweeper.
            assert figures["down_lines"] <= 8, log[-5000:]
            assert figures["tracebacks"] <= 4, log[-8000:]
        finally:
            stack.stop()
