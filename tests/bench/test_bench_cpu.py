"""The bench's CPU accounting (promesa_bench.cpu): the machine's busy time over a phase, and whose it was."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

from promesa_bench.cpu import CpuWindow, Metronome, drift, drifted

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
    from promesa_bench.harness import underused_phases

    busy = {"ms_per_unit": 1.5, "busy_share": 0.92, "ms_per_unit_by_process": {}}
    idle = {"ms_per_unit": 1.7, "busy_share": 0.71, "ms_per_unit_by_process": {}}
    assert underused_phases({"ingest baseline": idle, "ingest alone": busy}) == ["ingest baseline"]
    assert underused_phases({"ingest baseline": busy, "ingest alone": None}) == []  # not measured


def test_the_metronome_reports_the_cpu_of_its_loop_in_each_window():
    small, large = Metronome(loop=5_000, period=0.02), Metronome(loop=40_000, period=0.02)
    try:
        began = time.monotonic()
        while min(len(small.ticks), len(large.ticks)) < 15:
            time.sleep(0.02)
        ended = time.monotonic()
    finally:
        small.close()
        large.close()
    # Eight times the loop costs several times the CPU (its own process's CPU: not the wall clock).
    assert large.median_ms(began, ended) > 3 * small.median_ms(began, ended) > 0
    assert small.median_ms(ended + 60, ended + 120) is None  # no tick in that window


def test_a_window_takes_the_median_of_its_own_ticks_only():
    metronome = Metronome.__new__(Metronome)  # the ticks alone, without a process
    metronome.ticks, metronome.period = [(1.0, 9.0), (2.0, 2.0), (3.0, 3.0), (4.0, 4.0), (5.0, 50.0)], 0.1
    assert metronome.median_ms(1.5, 4.5) == 3.0
    assert metronome.median_ms(2.0, 2.0) == 2.0  # a tick at an edge is in
    assert metronome.median_ms(3.1, 3.2) == 3.0  # a window shorter than a period: the tick just before it
    assert metronome.median_ms(3.3, 3.5) is None  # none within a period and a half


def test_two_phases_at_different_machine_speeds_are_flagged():
    assert drift({"metronome_ms": 2.0}, {"metronome_ms": 2.6}) == 1.3 and drifted(1.3)
    assert drift({"metronome_ms": 2.0}, {"metronome_ms": 1.9}) == 0.95 and not drifted(0.95)
    assert drift(None, {"metronome_ms": 2.0}) is None and not drifted(None)  # a phase not measured
    assert drift({"metronome_ms": None}, {"metronome_ms": 2.0}) is None
