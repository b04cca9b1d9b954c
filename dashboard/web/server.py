"""The web server: gunicorn, as `promesa web` runs it and `promesa bench` measures it.

This module is also gunicorn's configuration (`-c python:dashboard.web.server`): gunicorn reads
the names below that are its settings and ignores the rest.
"""

from __future__ import annotations

import gc
import sys

from dashboard.core import logs, tracing
from dashboard.queue import handoff

# gunicorn would take X-Forwarded-Proto from a peer on 127.0.0.1 as https; the app decides instead
# (PROMESA_TRUSTED_PROXIES, see dashboard.web.security), so a local process cannot claim https.
forwarded_allow_ips = ""
# PROMESA_LOG_FORMAT=json: gunicorn's lines and the app's as JSON objects (empty: gunicorn's own text lines).
logconfig_dict = logs.gunicorn_logconfig()
# gthread's worker, whose long-polled pulls wait without a thread each (dashboard.web.parking).
worker_class = "dashboard.web.parking.ParkingWorker"
# Open connections per process: kept-alive and waiting pulls included (PROMESA_PULL_WAITS_PER_PROCESS of them).
worker_connections = 1000


def freeze_heap() -> None:
    """Everything loaded so far lives as long as the process: keep it out of the cyclic garbage
    collector's scans, which otherwise cost the workers CPU and the overview's requests latency."""
    gc.freeze()


def post_worker_init(worker) -> None:
    freeze_heap()  # the app is loaded
    tracing.configure("web")  # after the fork: the span exporter's thread is this process's own

    handoff.start(served_app(worker))  # ingest hands its work to Redis from a thread of this worker


def served_app(worker):
    """The Flask app a gunicorn worker serves (the parking worker wraps it)."""
    return getattr(worker, "flask_app", None) or worker.wsgi


APP = "dashboard.app:create_app()"
CONFIG = "python:dashboard.web.server"


def command(bind: str, workers: int, access_log: bool = True, app: str = APP, config: str = CONFIG) -> list[str]:
    """The gunicorn command line for the dashboard and API (`app`, `config`: another app or gunicorn
    configuration served the same way)."""
    argv = [sys.executable, "-m", "gunicorn", "--config", config, "--workers", str(workers),
            "--threads", "4", "--bind", bind, "--keep-alive", "30",
            # gunicorn's control socket defaults to one path in the home folder, shared by every server
            # of that user; Promesa does not use it, so none is opened.
            "--no-control-socket"]
    if access_log:
        argv += ["--access-logfile", "-"]
    return argv + [app]
