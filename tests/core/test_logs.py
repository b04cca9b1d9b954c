"""PROMESA_LOG_FORMAT=json: every process writes one JSON object per line (time, level, logger, message and the
ids the line is about); text stays the default; a value it cannot be stops the process with the choices."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import urllib.request

import pytest

from dashboard.core.logs import JsonLines, gunicorn_logconfig

from tests.support.web_server import promesa_web


def record(message, *args, exc_info=None, **extra) -> logging.LogRecord:
    made = logging.LogRecord("dashboard.delivery.engine", logging.WARNING, __file__, 1, message, args, exc_info)
    made.__dict__.update(extra)
    return made


def test_a_line_names_the_ids_it_is_about_and_keeps_its_traceback():
    delivery, subscription = "dlv_01M965H1G0611RQ6NDBPC4X175", "sub_01M965H1G0611RQ6NDBPC4X176"
    try:
        raise ValueError("boom")
    except ValueError:
        line = JsonLines().format(record("delivery %s of %s: gave up", delivery, subscription,
                                         exc_info=sys.exc_info(), team_id=7, consumer_id=None))
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["message"] == f"delivery {delivery} of {subscription}: gave up"
    assert (parsed["level"], parsed["logger"], parsed["delivery_id"], parsed["subscription_id"], parsed["team_id"]) \
        == ("WARNING", "dashboard.delivery.engine", delivery, subscription, 7)
    assert "consumer_id" not in parsed and parsed["time"].endswith("Z") and "ValueError: boom" in parsed["exception"]


def test_text_is_the_default_and_an_unknown_format_says_the_choices():
    assert gunicorn_logconfig({}) == {} and gunicorn_logconfig({"PROMESA_LOG_FORMAT": "json"})["root"]["handlers"]
    done = subprocess.run([sys.executable, "-m", "dashboard.cli", "--help"], capture_output=True, text=True,
                          env=dict(os.environ, PROMESA_LOG_FORMAT="yaml"), timeout=60)
    assert done.returncode != 0 and "PROMESA_LOG_FORMAT='yaml': it is text (the default) or json" in done.stderr


@pytest.mark.slow
def test_a_worker_and_the_web_write_json_lines(app, producer, tmp_path, config):
    env = dict(os.environ, PROMESA_LOG_FORMAT="json", DATABASE_URL=config["SQLALCHEMY_DATABASE_URI"],
               REDIS_URL=config["REDIS_URL"], PROMESA_INSTANCE_PATH=app.instance_path,
               PROMESA_REDIS_PREFIX=config["PROMESA_REDIS_PREFIX"], PROMESA_QUEUE=config["PROMESA_QUEUE"],
               SECRET_KEY=app.config["SECRET_KEY"], PROMESA_ENCRYPTION_KEY=app.config["PROMESA_ENCRYPTION_KEY"])
    worked = subprocess.run([sys.executable, "-m", "dashboard.cli", "worker", "--burst"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert worked.returncode == 0, worked.stderr
    lines = [json.loads(line) for line in worked.stderr.splitlines() if line.strip()]  # every line, RQ's too
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert any(line["logger"] == "rq.worker" for line in lines)

    with promesa_web(app, tmp_path / "web.log", PROMESA_LOG_FORMAT="json", PROMESA_ACCESS_LOG="1") as (web, _):
        urllib.request.urlopen(f"{web}/healthz", timeout=10).read()
    written = [line for line in (tmp_path / "web.log").read_text().splitlines() if line.strip()]
    parsed = [json.loads(line) for line in written]  # every line, gunicorn's and the app's
    assert any(line["logger"] == "gunicorn.error" and "Booting worker" in line["message"] for line in parsed)
    assert any(line["logger"] == "gunicorn.access" and "GET /healthz" in line["message"] for line in parsed)
