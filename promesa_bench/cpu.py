"""Where a bench phase's CPU went: the whole machine's busy time, and each kind of process's share.

On two shared cores the bench's ratios are a question of total CPU (the README's "The workers' CPU per
delivery"): end to end ÷ ingest alone is about ingest's CPU per event over ingest's plus delivery's, if the
cores are busy all along. So each phase reports its CPU per event or delivery, how busy the cores were, and
the same by process (the web, the workers, PostgreSQL, Redis, the receiver, this publisher).

A ratio of two phases is only fair if the machine ran at one speed in both. A `Metronome` times one fixed
piece of pure Python ten times a second, each phase reports its median cost, and a ratio whose two phases
differ by more than DRIFT_ALLOWED is flagged. (Built when the publisher's CPU per event, the same work in
every phase, differed by up to 1.6x between two phases of one run; the metronome then showed the machine's
speed within 4.4 % in every run, and that spread to be the system's own, not the machine's.)
"""

from __future__ import annotations

import bisect
import os
import statistics
import subprocess
import sys
import threading
import time

import psutil

# Process names of the services, as the operating system shows them.
_SERVICES = (("postgres", "postgresql"), ("redis-server", "redis"))


class CpuWindow:
    """The CPU spent from its making to `close`."""

    def __init__(self, run, web=None):
        """`web`: the web server to count as the web, if not the run's own (the bare-view baseline's)."""
        self.roles = _roles(run, web)
        self.metronome = getattr(run, "metronome", None)
        self.wall = time.monotonic()
        self.busy = _busy_seconds()
        self.by_process = _process_seconds()

    def close(self, units: int) -> dict:
        """Busy CPU ms per unit (an event or a delivery), in all and by kind of process, and how busy the cores
        were (1.0: all of them, all along)."""
        busy = _busy_seconds() - self.busy
        ended = time.monotonic()
        wall = ended - self.wall
        by_role: dict[str, float] = {}
        for (pid, name), seconds in _process_seconds().items():
            spent = seconds - self.by_process.get((pid, name), 0.0)
            role = self.roles.get(pid) or _service(name)
            by_role[role] = by_role.get(role, 0.0) + spent
        per_unit = (lambda seconds: round(seconds * 1000 / units, 3)) if units else (lambda _: None)
        return {"ms_per_unit": per_unit(busy),
                "busy_share": round(busy / (wall * (psutil.cpu_count() or 1)), 3) if wall > 0 else None,
                "ms_per_unit_by_process": {role: per_unit(seconds) for role, seconds in sorted(by_role.items())},
                "metronome_ms": self.metronome.median_ms(self.wall, ended) if self.metronome else None}


# The metronome's piece of work: about 2 ms of CPU on a 2-core machine of 2026, so ten a second cost 1 % of it.
METRONOME_LOOP = 20_000
METRONOME_PERIOD = 0.1
_METRONOME_SCRIPT = """
import sys, time
def work(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total
n, period = int(sys.argv[1]), float(sys.argv[2])
while True:
    began = time.thread_time()
    work(n)
    print(time.monotonic(), (time.thread_time() - began) * 1000, flush=True)
    time.sleep(period)
"""
# Two phases whose metronomes differ by more than this ran on a machine of another speed: their ratio says
# more about the machine than about what was measured.
DRIFT_ALLOWED = 0.1


class Metronome:
    """The machine's speed over time: a process of its own spends the same pure-Python loop every
    METRONOME_PERIOD seconds, and reports the CPU (not wall) time it took, against the monotonic clock that
    every process shares. Its cost rises when the cores run slower for the same code (another tenant on the
    host, its hyperthread sibling busy, a lower clock)."""

    def __init__(self, loop: int = METRONOME_LOOP, period: float = METRONOME_PERIOD):
        self.ticks: list[tuple[float, float]] = []  # (monotonic, CPU ms), in order
        self.period = period
        self.proc = subprocess.Popen([sys.executable, "-c", _METRONOME_SCRIPT, str(loop), str(period)],
                                     stdout=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, name="metronome", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            at, spent = line.split()
            self.ticks.append((float(at), float(spent)))

    def median_ms(self, start: float, end: float) -> float | None:
        """The median CPU ms of a tick between two `time.monotonic()` readings, and up to a period and a
        half either side, so that a window shorter than a period has one too (None: no tick there)."""
        ticks = self.ticks[:]  # appended to by the reader
        lo = bisect.bisect_left(ticks, (start - 1.5 * self.period,))
        hi = bisect.bisect_right(ticks, (end + 1.5 * self.period, float("inf")))
        return round(statistics.median(spent for _, spent in ticks[lo:hi]), 3) if hi > lo else None

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)


def machine_speed_since(run, began: float) -> float | None:
    """The run's metronome's median from `began` (a `time.monotonic()` reading) until now, if it has one."""
    metronome = getattr(run, "metronome", None)
    return metronome.median_ms(began, time.monotonic()) if metronome else None


def drift(before: dict | None, after: dict | None) -> float | None:
    """How much slower (above 1) or faster the machine ran in phase `after` than in `before` (their CPU
    windows' metronomes)."""
    if not before or not after or not before.get("metronome_ms") or not after.get("metronome_ms"):
        return None
    return round(after["metronome_ms"] / before["metronome_ms"], 3)


def drifted(speed_ratio: float | None) -> bool:
    return speed_ratio is not None and abs(speed_ratio - 1) > DRIFT_ALLOWED


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
    if getattr(run, "metronome", None) is not None:
        roles[run.metronome.proc.pid] = "metronome"
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
