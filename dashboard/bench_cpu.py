"""Where a bench phase's CPU went: the whole machine's busy time, and each kind of process's share.

On two shared cores the bench's ratios are a question of total CPU (the README's "The workers' CPU per
delivery"): end to end ÷ ingest alone is about ingest's CPU per event over ingest's plus delivery's, if the
cores are busy all along. So each phase reports its CPU per event or delivery, how busy the cores were, and
the same by process (the web, the workers, PostgreSQL, Redis, the receiver, this publisher).
"""

from __future__ import annotations

import os
import time

import psutil

# Process names of the services, as the operating system shows them.
_SERVICES = (("postgres", "postgresql"), ("redis-server", "redis"))


class CpuWindow:
    """The CPU spent from its making to `close`."""

    def __init__(self, run, web=None):
        """`web`: the web server to count as the web, if not the run's own (the bare-view baseline's)."""
        self.roles = _roles(run, web)
        self.wall = time.monotonic()
        self.busy = _busy_seconds()
        self.by_process = _process_seconds()

    def close(self, units: int) -> dict:
        """Busy CPU ms per unit (an event or a delivery), in all and by kind of process, and how busy the cores
        were (1.0: all of them, all along)."""
        busy = _busy_seconds() - self.busy
        wall = time.monotonic() - self.wall
        by_role: dict[str, float] = {}
        for (pid, name), seconds in _process_seconds().items():
            spent = seconds - self.by_process.get((pid, name), 0.0)
            role = self.roles.get(pid) or _service(name)
            by_role[role] = by_role.get(role, 0.0) + spent
        per_unit = (lambda seconds: round(seconds * 1000 / units, 3)) if units else (lambda _: None)
        return {"ms_per_unit": per_unit(busy),
                "busy_share": round(busy / (wall * (psutil.cpu_count() or 1)), 3) if wall > 0 else None,
                "ms_per_unit_by_process": {role: per_unit(seconds) for role, seconds in sorted(by_role.items())}}


def _busy_seconds() -> float:
    t = psutil.cpu_times()
    return t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def _process_seconds() -> dict[tuple[int, str], float]:
    """User and system CPU seconds of every process, by (pid, name): a pid reused by another process starts at 0."""
    seconds = {}
    for proc in psutil.process_iter(["name", "cpu_times"]):
        times = proc.info["cpu_times"]
        if times is not None:
            seconds[(proc.pid, proc.info["name"] or "")] = times.user + times.system
    return seconds


def _roles(run, web=None) -> dict[int, str]:
    """The bench's own processes by pid: the web server (the run's first child, or `web`) and its processes, the
    workers, the receivers, and this one (the publisher)."""
    roles = {os.getpid(): "publisher"}
    groups = [("web", [web] if web is not None else run.children[:1]), ("workers", run.children[1:]),
              ("receiver", run.receiver_procs)]
    for role, procs in groups:
        for proc in procs:
            roles[proc.pid] = role
            try:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    roles[child.pid] = role
            except psutil.NoSuchProcess:
                pass
    return roles


def _service(name: str) -> str:
    for prefix, role in _SERVICES:
        if name.startswith(prefix):
            return role
    return "other"
