"""Redis failing over under `promesa up`: Promesa reaches Redis through a Sentinel group on 127.0.0.1 (a master,
its replica, three sentinels). The master is SIGKILLed while a producer publishes and the workers deliver to a
loopback receiver; the sentinels promote the replica. Ingest answers 202, or 503 with Retry-After, never 500;
every process (web, workers, sweeper) carries on with the new master without a restart; every accepted event is
delivered and recorded once; and the time from the kill to the first delivery through the new master is measured."""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.error
import urllib.request

import pytest
import redis

from dashboard.cli import cli

from ..conftest import IN_CI
from ..support.publishing import RawPublisher
from ..support.sentinel_group import SERVICE, SentinelGroup
from ..support.waiting import wait_until
from .conftest import UP_BEATS, beating, close_the_books, query, report, unsettled

pytestmark = pytest.mark.slow

# Requests one worker keeps in flight to one endpoint, times the two workers of `promesa up`.
IN_FLIGHT_PER_ENDPOINT = 8 * 2


@pytest.fixture
def sentinel_group(tmp_path):
    if shutil.which("redis-server") is None:
        if IN_CI:
            pytest.fail("CI=true and no redis-server on PATH (Debian's redis-server package): this fault test needs it")
        pytest.skip("no redis-server on PATH (Debian's redis-server package): a Sentinel group needs one")
    group = SentinelGroup(tmp_path / "sentinel")
    try:
        group.start()
        yield group
    finally:
        group.stop()


@pytest.fixture
def fault_redis_url(sentinel_group):
    """Every Promesa process asks the group's sentinels for the master."""
    return sentinel_group.url


def redis_named_by_readyz(url: str) -> str:
    """Which Redis the web's /readyz asked, ready (200) or not (503); loopback is shown the details."""
    try:
        with urllib.request.urlopen(url + "/readyz?verbose=1", timeout=10) as resp:
            return json.loads(resp.read())["redis_server"]
    except urllib.error.HTTPError as not_ready:
        return json.loads(not_ready.read())["redis_server"]


def test_the_master_killed_during_delivery(stack, producer, receiver, sentinel_group, fault_app):
    producer.subscribe(receiver.url + "/slow/0.05")
    stack.start()
    children = stack.children()
    old_master, replica = sentinel_group.master.port, sentinel_group.replica.port
    assert redis_named_by_readyz(stack.url) == f"sentinel service {SERVICE}, master 127.0.0.1:{old_master}"

    stop = threading.Event()
    publisher = RawPublisher(stack.url, producer.token, stop)
    publisher.start()
    assert receiver.wait_for(20, timeout=30)  # deliveries on the wire
    killed_at = time.time()
    sentinel_group.kill_master()
    assert wait_until(lambda: sentinel_group.master_port() == replica, timeout=30, every=0.05)
    promoted_at = time.time()

    def first_delivery_posted_after_the_kill() -> float | None:
        # Such an event reached Redis after the kill (its hand-off, or the sweeper): only the new master was there.
        posted = dict(publisher.posted_at)
        return min((r.at for r in list(receiver.requests) if posted.get(json.loads(r.body)["id"], 0) > killed_at),
                   default=None)

    assert wait_until(lambda: first_delivery_posted_after_the_kill() is not None, timeout=30, every=0.05)
    delivered_at = first_delivery_posted_after_the_kill()

    # Every process carries on with the new master: the web's readiness, and the beats of the workers and the
    # sweeper written there since the promotion, with none of them restarted.
    new_master = f"sentinel service {SERVICE}, master 127.0.0.1:{replica}"
    assert wait_until(lambda: redis_named_by_readyz(stack.url) == new_master, timeout=15)
    promoted = redis.Redis(unix_socket_path=str(sentinel_group.replica.socket))
    assert wait_until(lambda: beating(promoted, "faults", since=promoted_at) == UP_BEATS, timeout=30), \
        beating(promoted, "faults", since=promoted_at)
    status = fault_app.test_cli_runner().invoke(cli, ["status"])
    assert f"redis       ok ({new_master})" in status.output, status.output

    stop.set()
    publisher.join(60)
    assert not publisher.is_alive()
    accepted = publisher.accepted
    assert wait_until(lambda: unsettled() == 0, timeout=60), unsettled()
    assert stack.process.poll() is None and stack.children() == children

    # Ingest answered 202, or 503 with Retry-After while the master was away; never 500.
    if set(publisher.answers) - {202, 503}:
        log = stack.log()
        at = log.find("Traceback")
        pytest.fail(f"ingest answered {publisher.answers}\n{log[max(0, at - 3000):at + 12000]}", pytrace=False)
    assert all(value and value.isdigit() for value in publisher.retry_after), publisher.retry_after

    figures = close_the_books(accepted, receiver, in_flight_bound=IN_FLIGHT_PER_ENDPOINT)
    # Recorded once: one event per accepted id (a retried POST kept its idempotency key), one succeeded attempt each.
    assert len(set(accepted)) == len(accepted) == query("SELECT count(*) FROM events")[0][0]
    assert query("SELECT count(*) FROM attempts WHERE status_code = 200")[0][0] == len(accepted)
    figures.update(answered_202=publisher.answers[202], answered_503=publisher.answers[503],
                   promoted_after_seconds=round(promoted_at - killed_at, 1),
                   first_delivery_after_seconds=round(delivered_at - killed_at, 1),
                   tracebacks=stack.log().count("Traceback (most recent call last)"))
    report("redis master SIGKILLed, Sentinel promotes the replica", figures)
    assert figures["tracebacks"] <= 4, stack.log()[-5000:]  # at most the drains that were running when it went
