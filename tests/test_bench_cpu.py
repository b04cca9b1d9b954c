"""The bench's CPU accounting (dashboard.bench_cpu): the machine's busy time over a phase, and whose it was."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

from dashboard.bench_cpu import CpuWindow

BURN = """
import sys, time
print("ready", flush=True)  # started: the interpreter's start-up is not in the window
sys.stdin.readline()  # burn only once the window is open
started = time.process_time()
while time.process_time() - started < 0.4:
    pass
print("burnt", flush=True)
sys.stdin.readline()  # stay alive until the window is closed: a finished process's CPU cannot be read
"""


def burn_here(seconds: float) -> None:
    started = time.process_time()
    while time.process_time() - started < seconds:
        pass


def test_a_window_counts_the_machines_busy_time_and_attributes_it_to_the_bench_processes():
    web = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert web.stdout.readline() == "ready\n"
        window = CpuWindow(SimpleNamespace(children=[web], receiver_procs=[]))
        web.stdin.write("go\n")
        web.stdin.flush()
        burn_here(0.3)
        assert web.stdout.readline() == "burnt\n"
        result = window.close(units=100)
    finally:
        web.stdin.close()
        web.wait(10)

    by_process = result["ms_per_unit_by_process"]
    # 0.4 s of the web's CPU and 0.3 s of this process's (the publisher), over 100 units; the clock ticks of
    # the operating system make each a few ms more or less.
    assert 3.6 <= by_process["web"] <= 5.0
    assert 2.7 <= by_process["publisher"] <= 4.5
    # The whole machine was busy for at least both of them.
    assert result["ms_per_unit"] >= 0.9 * (by_process["web"] + by_process["publisher"])
    assert 0 < result["busy_share"] <= 1.05
    assert "workers" not in by_process  # no worker was running


def test_a_window_over_nothing_says_so():
    result = CpuWindow(SimpleNamespace(children=[], receiver_procs=[])).close(units=0)
    assert result["ms_per_unit"] is None and set(result["ms_per_unit_by_process"].values()) == {None}


def test_a_publishing_phase_that_left_the_cores_idle_is_named():
    from dashboard.bench import underused_phases

    busy = {"ms_per_unit": 1.5, "busy_share": 0.92, "ms_per_unit_by_process": {}}
    idle = {"ms_per_unit": 1.7, "busy_share": 0.71, "ms_per_unit_by_process": {}}
    assert underused_phases({"ingest baseline": idle, "ingest alone": busy}) == ["ingest baseline"]
    assert underused_phases({"ingest baseline": busy, "ingest alone": None}) == []  # not measured
