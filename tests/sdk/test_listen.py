"""``promesa-receiver listen`` as a developer runs it: a real process, against the test's Promesa served on a real
port, forwarding to a real Flask app on 127.0.0.1 that verifies every signature with the SDK."""

from __future__ import annotations

import os
import pty
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from flask import Flask, request
from promesa_receiver import VerificationError, verify
from promesa_receiver.listen import EMPTY_PAUSE_SECONDS, LEASE_SECONDS, PULL_LIMIT, forward_target
from sqlalchemy import func, select

from dashboard.app import create_app
from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Delivery, DeliveryState, Subscription
from dashboard.operations.sweeper import sweep_once

from ..support.served import served
from ..support.waiting import wait_until

SDK = Path(__file__).resolve().parents[2] / "sdk"
# The command's own behaviour: the SQL it exercises (pull, ack, a session seen and swept) runs on both databases in
# tests/subscriptions/test_listen_sessions.py and tests/delivery/test_pull.py.
ON_SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


class Listening:
    """`python -m promesa_receiver listen ...` in a process of its own; its output read line by line."""

    def __init__(self, *args: str, env: dict | None = None, terminal: bool = False):
        """`terminal`: its stdout is a terminal (a pseudo-terminal the test reads), not a pipe."""
        reading, writing = pty.openpty() if terminal else (None, subprocess.PIPE)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "promesa_receiver", "listen", *args], stdout=writing,
            stderr=subprocess.PIPE, text=True, bufsize=1,
            env={**(env if env is not None else os.environ), "PYTHONPATH": str(SDK)})
        if terminal:
            os.close(writing)
        self.output = open(reading, encoding="utf-8") if terminal else self.process.stdout
        self.lines: queue.Queue[str | None] = queue.Queue()  # None: its output has ended
        self.printed: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self.output:
                self.lines.put(line.rstrip("\r\n"))
        except OSError:  # a pseudo-terminal whose other end has closed
            pass
        self.lines.put(None)

    def line_starting(self, start: str, timeout: float = 30) -> str:
        while True:
            line = self.lines.get(timeout=timeout)
            assert line is not None, f"it ended without printing {start!r}: {self.printed}"
            self.printed.append(line)
            if line.startswith(start):
                return line

    def end(self, signum=None, timeout: float = 30) -> tuple[int, list[str], str]:
        """(exit status, every line it printed, its stderr), after `signum` if given."""
        if signum is not None:
            self.process.send_signal(signum)
        status = self.process.wait(timeout=timeout)
        stderr = self.process.stderr.read()
        while (line := self.lines.get(timeout=timeout)) is not None:
            self.printed.append(line)
        return status, self.printed, stderr

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)


@pytest.fixture
def promesa(config):
    """The test's Promesa (its database, its clock) on a real port: its base URL."""
    with served(create_app(config)) as url:
        yield url


@pytest.fixture
def local_app():
    """A developer's app on 127.0.0.1 that verifies each request with the secret listen printed (`.secrets`)."""
    app = Flask("local_app")
    app.secrets, app.received, app.refused = [], [], []

    @app.post("/webhooks")
    def receive():
        try:
            verify(request.get_data(), request.headers.get("X-Signature"), app.secrets)
        except VerificationError as exc:
            app.refused.append(str(exc))
            return str(exc), 400
        assert request.content_type == "application/json"
        app.received.append(request.headers["X-Event-Id"])
        return "", 204

    with served(app) as url:
        app.url = url + "/webhooks"
        yield app


def started(listening: Listening) -> tuple[str, str]:
    """(subscription id, secret) from the lines a new listen session prints first."""
    subscription_id = re.match(r"Listen session (sub_\w+)", listening.line_starting("Listen session")).group(1)
    secret = listening.line_starting("Signing secret").rsplit(" ", 1)[1]
    listening.line_starting("Forwarding to")
    return subscription_id, secret


def settled(subscription_id: str) -> int:
    db.session.expire_all()
    return db.session.scalar(select(func.count()).select_from(Delivery).where(
        Delivery.subscription_id == subscription_id, Delivery.state == DeliveryState.SUCCEEDED))


@ON_SQLITE
def test_listen_forwards_100_verified_events_and_ctrl_c_deletes_its_session(promesa, local_app, producer):
    listening = Listening("--forward-to", local_app.url, "--url", promesa, "--token", producer.token,
                          "--events", "file.*")
    try:
        subscription_id, secret = started(listening)
        local_app.secrets.append(secret)
        sub = db.session.get(Subscription, subscription_id)
        assert (sub.mode, sub.listen, sub.event_types) == ("pull", True, ["file.*"])
        events = [{"type": "file.updated", "data": {"resource_id": f"f_{n}", "resource_version": 1}} for n in range(100)]
        published = [e["id"] for e in producer.post("/api/v1/events/batch", {"events": events}).get_json()["data"]]
        producer.publish("invoice.paid")  # not a type it listens to
        assert wait_until(lambda: settled(subscription_id) == 100, timeout=60), listening.printed
        status, printed, stderr = listening.end(signal.SIGINT)
    finally:
        listening.kill()

    assert status == 0, stderr
    assert sorted(local_app.received) == sorted(published) and local_app.refused == []
    lines = [line for line in printed if " file.updated " in line]
    assert len(lines) == 100 and all(re.fullmatch(r"\d\d:\d\d:\d\d  file\.updated  evt_\w+  204  \d+ ms", line)
                                     for line in lines), lines[:3]
    assert "\033[" not in "".join(printed)  # no colour into a pipe
    assert printed[-1] == f"Stopped. Deleted the listen session {subscription_id}."
    db.session.expire_all()
    assert db.session.get(Subscription, subscription_id).deleted_at is not None
    assert db.session.scalar(select(func.count()).select_from(Delivery).where(
        Delivery.subscription_id == subscription_id, Delivery.attempt_count != 1)) == 0  # each acked once
    assert db.session.scalar(select(AuditEntry.actor_kind).where(
        AuditEntry.subscription_id == subscription_id, AuditEntry.action == "subscription.deleted")) == "token"


@ON_SQLITE
def test_a_killed_listen_leaves_its_session_to_the_sweeper(app, promesa, local_app, producer, clock):
    listening = Listening("--forward-to", local_app.url, "--url", promesa, "--token", producer.token)
    try:
        subscription_id, _ = started(listening)
    finally:
        listening.kill()  # SIGKILL: nothing of it runs again
    producer.publish()  # owed to the dead session now
    db.session.expire_all()
    assert db.session.get(Subscription, subscription_id).deleted_at is None

    clock.advance(app.config["PROMESA_LISTEN_IDLE_SECONDS"] + 1)
    sweep_once(app)
    db.session.expire_all()
    assert db.session.get(Subscription, subscription_id).deleted_at == clock.now()
    assert db.session.scalar(select(Delivery.state).where(Delivery.subscription_id == subscription_id)) == \
        DeliveryState.CANCELLED
    assert db.session.scalar(select(AuditEntry.actor_kind).where(
        AuditEntry.subscription_id == subscription_id, AuditEntry.action == "subscription.deleted")) == "system"


@ON_SQLITE
def test_a_session_deleted_under_it_ends_listen_saying_so(promesa, local_app, producer):
    listening = Listening("--forward-to", local_app.url, "--url", promesa, "--token", producer.token)
    try:
        subscription_id, _ = started(listening)
        producer.client.delete(f"/api/v1/subscriptions/{subscription_id}", headers=producer.headers())
        status, printed, stderr = listening.end()  # its next pull is refused
    finally:
        listening.kill()
    assert status == 1 and "Promesa answered 409: this subscription is deleted" in stderr
    assert "run listen again for a new one" in stderr and not printed[-1].startswith("Stopped")


@ON_SQLITE
def test_a_promesa_gone_away_is_tried_again_and_a_session_it_cannot_delete_is_left_to_the_sweeper(config, local_app,
                                                                                                   producer):
    with served(create_app(config)) as url:
        listening = Listening("--forward-to", local_app.url, "--url", url, "--token", producer.token)
        subscription_id, _ = started(listening)
    try:  # the server is gone now
        assert listening.line_starting("could not reach Promesa at ").endswith("; trying again in 1 s")
        status, printed, stderr = listening.end(signal.SIGINT)
    finally:
        listening.kill()
    assert status == 1 and f"could not delete {subscription_id}" in stderr and "Promesa deletes it once idle" in stderr
    db.session.expire_all()
    assert db.session.get(Subscription, subscription_id).deleted_at is None


@ON_SQLITE
def test_attached_to_a_pull_subscription_it_leaves_it_when_stopped(promesa, local_app, producer):
    sub = producer.post("/api/v1/subscriptions", {"mode": "pull"}).get_json()
    local_app.secrets.append(sub["secret"])
    event = producer.publish()
    listening = Listening("--forward-to", local_app.url, "--url", promesa, "--token", producer.token,
                          "--subscription", sub["id"])
    try:
        listening.line_starting(f"Attached to the pull subscription {sub['id']}")
        assert listening.line_starting("Forwarding to")
        assert " 204 " in listening.line_starting("")  # the first delivery's line, once forwarded
        status, printed, stderr = listening.end(signal.SIGTERM)
    finally:
        listening.kill()
    assert status == 0, stderr
    assert local_app.received == [event["id"]] and "Signing secret" not in "".join(printed)
    assert printed[-1] == f"Stopped. {sub['id']} stays: this listen did not make it."
    db.session.expire_all()
    assert db.session.get(Subscription, sub["id"]).deleted_at is None


@pytest.mark.parametrize("no_color, coloured", [(None, "\033[32m204\033[0m"), ("1", None)])
@ON_SQLITE
def test_a_terminal_shows_the_status_in_colour_unless_no_color_is_set(promesa, local_app, producer, no_color, coloured):
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | ({"NO_COLOR": no_color} if no_color else {})
    listening = Listening("--forward-to", local_app.url, "--url", promesa, "--token", producer.token, env=env,
                          terminal=True)
    try:
        local_app.secrets.append(started(listening)[1])
        producer.publish()
        line = listening.line_starting("")
        listening.end(signal.SIGINT)
    finally:
        listening.kill()
    if coloured:
        assert f"  {coloured}  " in line
    else:
        assert "\033[" not in line and "  204  " in line


@ON_SQLITE
def test_after_an_empty_answer_that_came_at_once_it_pauses_instead_of_asking_again_at_once(config, local_app, producer):
    pulls = []  # (when, query) of each pull the server answered
    promesa = create_app(config)

    def recording(environ, start_response):
        if environ["PATH_INFO"].endswith("/pull"):
            pulls.append((time.monotonic(), environ["QUERY_STRING"]))
        return promesa(environ, start_response)

    with served(recording) as url:
        listening = Listening("--forward-to", local_app.url, "--url", url, "--token", producer.token)
        try:
            started(listening)
            assert wait_until(lambda: len(pulls) >= 3, timeout=30)
            assert listening.end(signal.SIGINT)[0] == 0
        finally:
            listening.kill()
    assert all(b - a >= EMPTY_PAUSE_SECONDS for (a, _), (b, _) in zip(pulls, pulls[1:]))  # nothing was due
    assert {query for _, query in pulls} == {f"limit={PULL_LIMIT}&wait=25&lease={LEASE_SECONDS}"}


@ON_SQLITE
def test_a_pull_refused_for_now_is_asked_again_and_the_session_goes_on(config, local_app, producer):
    promesa = create_app(config)
    refused = []

    def too_many_waiting_at_first(environ, start_response):
        if environ["PATH_INFO"].endswith("/pull") and len(refused) < 2:  # as a server with its waits full answers
            refused.append(environ["QUERY_STRING"])
            start_response("429 Too Many Requests", [("Content-Type", "application/json"), ("Retry-After", "1")])
            return [b'{"error": "your team already has 100 pulls waiting on this server process"}']
        return promesa(environ, start_response)

    with served(too_many_waiting_at_first) as url:
        listening = Listening("--forward-to", local_app.url, "--url", url, "--token", producer.token)
        try:
            subscription_id, secret = started(listening)
            local_app.secrets.append(secret)
            assert "100 pulls waiting" in listening.line_starting("Promesa answered 429")
            producer.post("/api/v1/events", {"type": "file.updated", "data": {"resource_id": "f_1"}})
            assert wait_until(lambda: len(local_app.received) == 1, timeout=30)
            assert listening.end(signal.SIGINT)[0] == 0
        finally:
            listening.kill()
    assert len(refused) == 2


@ON_SQLITE
def test_an_app_that_cannot_be_reached_is_acked_as_a_failure(promesa, producer):
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{unused.getsockname()[1]}/webhooks"
    listening = Listening("--forward-to", nowhere, "--url", promesa, "--token", producer.token)
    try:
        subscription_id, _ = started(listening)
        accepted = producer.publish()
        line = listening.line_starting("")
        status, _, stderr = listening.end(signal.SIGINT)
    finally:
        listening.kill()
    assert status == 0, stderr
    assert f"  {accepted['id']}  failed  " in line and "Connection refused" in line
    attempt = db.session.scalar(select(Delivery).where(Delivery.subscription_id == subscription_id)).attempts[0]
    assert attempt.status_code is None and attempt.error.startswith("receiver: http://127.0.0.1:")


def subscriptions() -> int:
    db.session.expire_all()
    return db.session.scalar(select(func.count()).select_from(Subscription))


@pytest.mark.parametrize("args, env, status, words", [
    (["--forward-to", "http://203.0.113.7:8000/webhooks"], {}, 2,
     "--forward-to must be an app on this machine: 203.0.113.7 is neither a loopback address nor one of this "
     "machine's"),
    (["--forward-to", "http://127.0.0.1:8000/webhooks"], {"PROMESA_TOKEN": None}, 2,
     "listen needs a team's API token: give --token or set PROMESA_TOKEN"),
    (["--forward-to", "http://127.0.0.1:8000/webhooks", "--token", "pk_not-a-token"], {}, 1,
     "Promesa answered 401: "),
    (["--forward-to", "http://127.0.0.1:8000/webhooks", "--events", "bad type!"], {}, 1,
     "Promesa answered 400: event_types must be"),
])
@ON_SQLITE
def test_it_refuses_clearly_and_makes_nothing(promesa, producer, args, env, status, words):
    given = {**os.environ, "PROMESA_TOKEN": producer.token, **env}
    listening = Listening(*args, "--url", promesa, env={k: v for k, v in given.items() if v is not None})
    try:
        done, printed, stderr = listening.end()
    finally:
        listening.kill()
    assert done == status and words in stderr, stderr
    assert subscriptions() == 0 and printed == []


def test_the_forward_target_is_this_machine_only():
    assert forward_target("http://localhost:3000/webhooks").addresses
    assert forward_target("http://[::1]:3000/h?x=1").path == "/h?x=1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.7", 9))  # no packet is sent: it picks the address a route would use
            own = probe.getsockname()[0]
        except OSError:
            own = None
    if own and not own.startswith("127."):
        assert forward_target(f"http://{own}:3000/webhooks").addresses == (own,)
    for url, words in [("http://0.0.0.0:3000/", "neither a loopback address"),
                       ("http://8.8.8.8/", "8.8.8.8 is neither"),
                       ("ftp://127.0.0.1/", "http:// or https://"),
                       ("http://user:pw@127.0.0.1/", "no user:password@"),
                       ("http://127.0.0.1:99999/", "the port must be"),
                       ("http://promesa-listen-test.invalid/", "does not resolve")]:
        with pytest.raises(ValueError, match=re.escape(words)):
            forward_target(url)

