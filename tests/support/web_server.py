"""`promesa web` (gunicorn, its parking worker) as a process of its own, serving the test's database and Redis."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def installation_env(app, base=None, **settings: str) -> dict[str, str]:
    """The environment a `promesa` process of the test app's installation runs in: `base` (this process's own
    by default) with its database, Redis prefix, instance folder and keys, and `settings`."""
    config = app.config
    return dict(os.environ if base is None else base, DATABASE_URL=config["SQLALCHEMY_DATABASE_URI"],
                REDIS_URL=config["REDIS_URL"], PROMESA_INSTANCE_PATH=app.instance_path,
                PROMESA_REDIS_PREFIX=config["PROMESA_REDIS_PREFIX"], PROMESA_QUEUE=config["PROMESA_QUEUE"],
                SECRET_KEY=config["SECRET_KEY"], PROMESA_ENCRYPTION_KEY=config["PROMESA_ENCRYPTION_KEY"]) | settings


@contextmanager
def promesa_web(app, log: Path, workers: int = 1, **settings: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """The test app's installation served by `promesa web` (its database, Redis prefix, instance folder and
    keys); `settings`: more environment (PROMESA_...). Its base URL and process; its output in `log`."""
    port = free_port()
    env = installation_env(app, PROMESA_ACCESS_LOG="0") | settings
    with open(log, "wb") as out:
        web = subprocess.Popen([sys.executable, "-m", "dashboard.cli", "web", "--port", str(port),
                                "--workers", str(workers)], env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_it_answers(url, web, log)
        yield url, web
    finally:
        web.terminate()
        try:
            web.wait(timeout=30)
        except subprocess.TimeoutExpired:
            web.kill()
            web.wait()


def _wait_until_it_answers(url: str, web: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if web.poll() is not None:
            raise AssertionError(f"promesa web exited {web.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise AssertionError(f"promesa web never answered:\n{log.read_text()[-3000:]}")
