"""The web server: gunicorn, as `promesa web` runs it and `promesa bench` measures it.

This module is also gunicorn's configuration (`-c python:dashboard.webserver`): gunicorn reads
the names below that are its settings and ignores the rest.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path


# gunicorn would take X-Forwarded-Proto from a peer on 127.0.0.1 as https; the app decides instead
# (PROMESA_TRUSTED_PROXIES, see dashboard.websecurity), so a local process cannot claim https.
forwarded_allow_ips = ""


def freeze_heap() -> None:
    """Everything loaded so far lives as long as the process: keep it out of the cyclic garbage
    collector's scans. They took 13% of a delivering worker's CPU, and on the overview a full
    collection every dozen requests added 70 ms to one of them."""
    gc.freeze()


def post_worker_init(worker) -> None:
    freeze_heap()  # the app is loaded
    from dashboard import handoff

    handoff.start(worker.wsgi)  # ingest hands its work to Redis from a thread of this worker
    _say_ready()


# A folder where each web process, once its app is loaded, leaves a file named by its pid (when set).
READY_DIR_ENV = "PROMESA_WEB_READY_DIR"


def _say_ready() -> None:
    """For whoever starts the server and must know when every process serves (`promesa bench`: keep-alive
    connections opened while one process is still loading the app all go to the other, and stay there)."""
    folder = os.environ.get(READY_DIR_ENV)
    if folder:
        Path(folder, str(os.getpid())).touch()


APP = "dashboard:create_app()"


def command(bind: str, workers: int, access_log: bool = True, app: str = APP) -> list[str]:
    """The gunicorn command line for the dashboard and API (`app`: another app served the same way)."""
    argv = [sys.executable, "-m", "gunicorn", "--config", "python:dashboard.webserver", "--workers", str(workers),
            "--threads", "4", "--bind", bind, "--keep-alive", "30",
            # gunicorn's control socket defaults to one path in the home folder, shared by every server
            # of that user; Promesa does not use it, so none is opened.
            "--no-control-socket"]
    if access_log:
        argv += ["--access-logfile", "-"]
    return argv + [app]
