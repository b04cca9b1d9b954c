"""gunicorn's configuration for the bench's servers: the service's own, plus a file per ready process.

Keep-alive connections stay with the process that accepted them, so the bench starts publishing only
once every process has loaded its app (`harness.Run.start_web` waits for these files).
"""

from __future__ import annotations

import os
from pathlib import Path

from dashboard.web import server
from dashboard.web.server import (  # noqa: F401  (gunicorn settings)
    forwarded_allow_ips,
    logconfig_dict,
    worker_class,
    worker_connections,
)

# A folder where each web process, once its app is loaded, leaves a file named by its pid.
READY_DIR_ENV = "PROMESA_BENCH_READY_DIR"


def say_ready() -> None:
    Path(os.environ[READY_DIR_ENV], str(os.getpid())).touch()


def post_worker_init(worker) -> None:
    server.post_worker_init(worker)
    say_ready()
