"""A WSGI app whose second gunicorn process takes two seconds longer to load than its first (for the bench's
wait for every web process: tests/test_bench_web.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from flask import Flask


def create_app() -> Flask:
    try:
        Path(os.environ["SLOW_SECOND_APP_LOCK"]).touch(exist_ok=False)  # the first process to load
    except FileExistsError:
        time.sleep(2.0)
    app = Flask(__name__)

    @app.get("/ready")
    def ready():
        return str(os.getpid())

    return app
