"""gunicorn's configuration for the bare baseline app: the service's settings, no hand-off thread."""

from __future__ import annotations

from dashboard.web.server import forwarded_allow_ips  # noqa: F401  (a gunicorn setting)
from promesa_bench.gunicorn_config import say_ready


def post_worker_init(worker) -> None:
    say_ready()
