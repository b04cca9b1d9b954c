"""The bench starts a web server and publishes only once every one of its processes serves: keep-alive
connections opened while one process was still loading all went to the other, and stayed there (a phase
then ran at one process's speed, one core idle)."""

from __future__ import annotations

import os
import time
import urllib.request
from types import SimpleNamespace

import psutil
import pytest

from promesa_bench import harness as bench

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_the_bench_waits_for_every_web_process_before_it_publishes(tmp_path):
    run = SimpleNamespace(tmp=tmp_path, web_workers=2, children=[], access_log=False)
    env = dict(os.environ, SLOW_SECOND_APP_LOCK=str(tmp_path / "lock"),
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    started = time.monotonic()
    proc, url = bench.Run.start_web(run, "web", "tests.support.slow_second_app:create_app()", env, "/ready",
                                    config="python:promesa_bench.gunicorn_baseline")
    try:
        waited = time.monotonic() - started
        workers = {child.pid for child in psutil.Process(proc.pid).children()}
        assert len(workers) == 2
        # Both said they were ready, the slow one included, before start_web returned.
        assert {int(marker.name) for marker in (tmp_path / "web-ready").iterdir()} == workers
        assert waited >= 2.0
        with urllib.request.urlopen(url + "/ready", timeout=5) as resp:
            assert int(resp.read()) in workers
    finally:
        proc.terminate()
        proc.wait(15)


def test_a_web_process_that_has_not_said_it_is_ready_is_not_counted(tmp_path):
    ready = tmp_path / "ready"
    ready.mkdir()
    (ready / "999999999").touch()  # a process that is gone (or never was this server's)
    me = psutil.Process()
    parent = SimpleNamespace(pid=me.ppid())
    assert bench._live_children(parent, ready) == set()
    (ready / str(me.pid)).touch()
    assert bench._live_children(parent, ready) == {me.pid}


def test_the_bare_baseline_is_served_without_a_hand_off_thread(tmp_path, monkeypatch):
    from flask import Flask

    from promesa_bench import gunicorn_baseline

    monkeypatch.setenv("PROMESA_BENCH_READY_DIR", str(tmp_path))
    bare = Flask("baseline")
    gunicorn_baseline.post_worker_init(SimpleNamespace(wsgi=bare))
    assert "promesa_handoff" not in bare.extensions
    assert [marker.name for marker in tmp_path.iterdir()] == [str(os.getpid())]
