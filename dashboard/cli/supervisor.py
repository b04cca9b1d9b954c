"""`promesa up`'s children (web, delivery workers, a worker per lane, sweeper): each is restarted when it dies, after a backoff
that grows while it keeps dying, so one child's crash never stops the others (the web above all)."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0
# A child that ran this long before dying starts again at the first backoff.
HEALTHY_SECONDS = 60.0


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    backoff: float = FIRST_BACKOFF_SECONDS
    restart_at: float | None = None
    restarts: int = field(default=0)


class Supervisor:
    def __init__(self, commands: dict[str, list[str]], env: dict[str, str]):
        self.children = [Child(name, argv) for name, argv in commands.items()]
        self.env = env

    def _start(self, child: Child) -> None:
        child.process = subprocess.Popen(child.argv, env=self.env)
        child.started_at = time.monotonic()
        child.restart_at = None

    def start(self) -> None:
        for child in self.children:
            self._start(child)

    def check(self) -> None:
        """Restart what died, once its backoff has passed."""
        now = time.monotonic()
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.restarts += 1
                    log.warning("restarting %s (restart %d)", child.name, child.restarts)
                    self._start(child)
                continue
            code = child.process.poll()
            if code is None:
                continue
            if now - child.started_at >= HEALTHY_SECONDS:
                child.backoff = FIRST_BACKOFF_SECONDS
            log.error("%s exited with status %s; restarting it in %.0f s", child.name, code, child.backoff)
            child.restart_at = now + child.backoff
            child.backoff = min(MAX_BACKOFF_SECONDS, child.backoff * 2)

    def run(self, stop: threading.Event, every: float = 0.5) -> None:
        while not stop.wait(every):
            self.check()

    def stop(self) -> None:
        running = [c.process for c in self.children if c.process is not None and c.process.poll() is None]
        for process in running:
            process.terminate()
        for process in running:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
