"""Processes a test starts in a session of their own (`start_new_session=True`), such as `promesa up` and its children."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def stop_group(process: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM to the leader, as Ctrl-C or systemd would stop it, and a wait of up to `timeout` seconds (a
    TimeoutExpired past it); then SIGKILL to whatever of its group is left, so no child outlives the test."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the leader and its children are already gone
            os.killpg(process.pid, signal.SIGKILL)
