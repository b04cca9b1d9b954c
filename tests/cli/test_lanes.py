"""The lanes (issue 35): `promesa up` starts a worker for each lane beside the delivery workers, a
delivery worker never takes a lane's job, and `promesa status` says when a lane has no worker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from rq import Worker

from dashboard.app import BASE_URL_SAID
from dashboard.cli import cli
from dashboard.core.extensions import db
from dashboard.delivery import worker
from dashboard.models import Check
from dashboard.queue import lanes
from dashboard.queue.work import WorkQueue

from ..support.process_groups import stop_group
from ..support.waiting import wait_until

on_sqlite = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@on_sqlite
def test_up_starts_a_worker_for_each_lane_and_the_delivery_workers_take_none_of_them(app, config, tmp_path):
    env = dict(os.environ, DATABASE_URL=config["SQLALCHEMY_DATABASE_URI"], REDIS_URL=config["REDIS_URL"],
               PROMESA_INSTANCE_PATH=str(tmp_path / "instance"), PROMESA_REDIS_PREFIX=config["PROMESA_REDIS_PREFIX"],
               PROMESA_QUEUE=config["PROMESA_QUEUE"])
    for unset in ("PROMESA_BASE_URL", BASE_URL_SAID):
        env.pop(unset, None)
    port = free_port()
    output = tmp_path / "up.log"
    with output.open("w") as log:
        up = subprocess.Popen([sys.executable, "-m", "dashboard.cli", "up", "--port", str(port), "--workers", "1"],
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    delivery = WorkQueue.for_app(app).rq
    try:
        deadline = time.monotonic() + 60
        while not (all(lane.workers == 1 for lane in lanes.states(app)) and Worker.count(queue=delivery) == 1
                   and _answers(f"http://127.0.0.1:{port}/healthz")):
            assert up.poll() is None and time.monotonic() < deadline, [lanes.states(app), Worker.count(queue=delivery)]
            time.sleep(0.2)
        # Said once for the whole start (not by each worker, the sweeper and each gunicorn worker), with its port.
        said = [line for line in output.read_text().splitlines() if "PROMESA_BASE_URL is not set" in line]
        assert len(said) == 1 and f"point at http://127.0.0.1:{port} " in said[0], said
        expected = {(config["PROMESA_QUEUE"],), *((lanes.queue_name(config["PROMESA_QUEUE"], lane),)
                                                  for lane in lanes.LANES)}

        def listening():  # a worker counted in its queue's registry may not be in RQ's list of all workers yet
            return {tuple(w.queue_names()) for w in Worker.all(connection=delivery.connection)}

        assert wait_until(lambda: listening() == expected, timeout=max(1.0, deadline - time.monotonic())), listening()
    finally:
        stop_group(up)


@on_sqlite
def test_a_delivery_worker_never_takes_a_check(app, producer, receiver):
    sub = producer.subscribe(receiver.url + "/ok")
    check_id = producer.post(f"/api/v1/subscriptions/{sub['id']}/checks").get_json()["id"]
    work = WorkQueue.for_app(app)
    assert worker.run(work, burst=True) == 0  # `promesa worker --burst`
    db.session.expire_all()
    assert db.session.get(Check, check_id).state == "running" and receiver.count() == 0
    assert lanes.queue("checks", app).job_ids == [f"check-{check_id}"]
    assert worker.run(work, burst=True, lane="checks") == 0  # `promesa worker --lane checks --burst`
    db.session.expire_all()
    assert db.session.get(Check, check_id).state == "finished" and receiver.count() == 5


@on_sqlite
def test_status_says_when_a_lane_has_no_worker(app):
    result = app.test_cli_runner().invoke(cli, ["status"])
    assert result.exit_code == 0, result.output
    assert ("lane checks   NO WORKER: receiver checks wait (0 queued) until `promesa worker --lane checks` runs"
            in result.output.splitlines())
    assert "lane repairs  NO WORKER: replays and discards wait" in result.output


@on_sqlite
def test_readyz_in_detail_lists_each_lanes_workers(app, client):
    body = client.get("/readyz?verbose=1").get_json()  # the test client is a loopback client
    assert body["lanes"] == [
        {"name": "checks", "runs": "receiver checks", "workers": 0, "queued": 0},
        {"name": "repairs", "runs": "replays and discards", "workers": 0, "queued": 0}]
