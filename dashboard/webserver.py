"""The web server: gunicorn, as `promesa web` runs it and `promesa bench` measures it.

This module is also gunicorn's configuration (`-c python:dashboard.webserver`): gunicorn reads
the names below that are its settings and ignores the rest.
"""

from __future__ import annotations

import gc
import sys


def post_worker_init(worker) -> None:
    # The app and everything it imported live as long as the worker: keep them out of the cyclic
    # garbage collector's scans (in a delivering worker those scans took 13% of the CPU).
    gc.freeze()


def command(bind: str, workers: int, access_log: bool = True, app: str = "dashboard:create_app()") -> list[str]:
    """The gunicorn command line for the dashboard and API (`app`: another app served the same way)."""
    argv = [sys.executable, "-m", "gunicorn", "--config", "python:dashboard.webserver", "--workers", str(workers),
            "--threads", "4", "--bind", bind, "--keep-alive", "30"]
    if access_log:
        argv += ["--access-logfile", "-"]
    return argv + [app]
