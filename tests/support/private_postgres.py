"""A PostgreSQL server of a test's own (Debian's postgresql binaries, `initdb` into a temporary folder,
on a free port of 127.0.0.1), which the test stops and starts again: a restart or a failover window.

PostgreSQL refuses to run as root; run as root (a container), the server runs as the `postgres`
user the Debian package creates, in a folder that user owns.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def postgres_bin_dir() -> Path | None:
    """The newest of Debian's /usr/lib/postgresql/<version>/bin, else wherever `initdb` is on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivatePostgres:
    """`host`: the address it listens on, and `run_in`: a command prefix its programs run under (a network
    namespace's `ip netns exec <name>`); `clients`: a network (CIDR) beside loopback whose clients it trusts."""

    def __init__(self, bin_dir: Path, host: str = "127.0.0.1", run_in: tuple[str, ...] = (),
                 clients: str | None = None):
        self.bin_dir = bin_dir
        self.host = host
        self.clients = clients
        self.port = _free_port()
        # Not under pytest's tmp_path: as root, that is a folder the postgres user cannot enter.
        self.directory = Path(tempfile.mkdtemp(prefix="promesa-pg-"))
        self.data = self.directory / "data"
        self.log = self.directory / "postgres.log"
        self.as_user: list[str] = list(run_in)
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.directory, user.pw_uid, user.pw_gid)
            self.as_user += ["runuser", "-u", "postgres", "--"]
        self.admin_url = self.url("postgres")

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@{self.host}:{self.port}/{database}"

    def _run(self, *argv: str, timeout: float = 60) -> None:
        done = subprocess.run([*self.as_user, *argv], capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {done.stdout}{done.stderr}")

    def init(self) -> None:
        self._run(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--no-sync", "--no-instructions")
        if self.clients:
            with open(self.data / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {self.clients} trust\n")

    def start(self) -> None:
        # Durability is not what is tested: no fsync, so the restart is seconds on a busy machine.
        options = (f"-p {self.port} -c listen_addresses={self.host} -k {self.directory} -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options,
                  "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """Down: `fast` ends every session (a restart or failover), `immediate` is a crash."""
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def destroy(self) -> None:
        if self.running():
            try:
                self.stop("immediate")
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(self.directory, ignore_errors=True)

    def wait_accepting(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection((self.host, self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
