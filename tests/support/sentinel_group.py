"""A Redis Sentinel failover group of a test's own on 127.0.0.1: a master, its replica and three sentinels
(`redis-server --sentinel`), with short timeouts, so that killing the master promotes the replica in seconds."""

from __future__ import annotations

import subprocess
from pathlib import Path

import redis

from .private_redis import PrivateRedis, redis_server_binary, wait_until_it_answers
from .waiting import wait_until
from .web_server import free_port

SERVICE = "mymaster"
# A master silent this long is down for a sentinel; two of the three agreeing start the failover.
DOWN_AFTER_MILLISECONDS = 1000
FAILOVER_TIMEOUT_MILLISECONDS = 5000
QUORUM = 2


class SentinelGroup:
    def __init__(self, directory: Path):
        self.directory = directory
        self.master = PrivateRedis(directory / "master", port=free_port())
        self.replica = PrivateRedis(directory / "replica", port=free_port(), replica_of=self.master.port)
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        """REDIS_URL for Promesa: the group's sentinels and its service."""
        return f"redis+sentinel://{','.join(f'127.0.0.1:{port}' for port in self.sentinel_ports)}/{SERVICE}"

    def start(self) -> None:
        self.master.start()
        self.replica.start()
        for port in self.sentinel_ports:
            self.sentinels.append(self._start_sentinel(port))
        # Ready to fail over once every sentinel has found the replica and the two other sentinels (their
        # hellos go every 2 s), and the replica holds the master's data.
        assert wait_until(self._formed, timeout=30), [self._asked(port).sentinel_master(SERVICE)
                                                      for port in self.sentinel_ports]

    def _start_sentinel(self, port: int) -> subprocess.Popen:
        directory = self.directory / f"sentinel-{port}"
        directory.mkdir(parents=True)
        config = directory / "sentinel.conf"  # a sentinel rewrites its file with what it learns
        config.write_text(f"port {port}\nbind 127.0.0.1\ndir {directory}\nlogfile {directory / 'sentinel.log'}\n"
                          f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} {QUORUM}\n"
                          f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MILLISECONDS}\n"
                          f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MILLISECONDS}\n")
        process = subprocess.Popen([redis_server_binary(), str(config), "--sentinel"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until_it_answers(self._asked(port))
        return process

    @staticmethod
    def _asked(port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, decode_responses=True)

    def _formed(self) -> bool:
        for port in self.sentinel_ports:
            state = self._asked(port).sentinel_master(SERVICE)
            if state["num-slaves"] < 1 or state["num-other-sentinels"] < len(self.sentinel_ports) - 1:
                return False
        return redis.Redis(unix_socket_path=str(self.replica.socket)).info("replication")["master_link_status"] == "up"

    def master_port(self) -> int | None:
        """The master's port as the sentinels say it, once two agree (None while they do not)."""
        said = []
        for port in self.sentinel_ports:
            try:
                address = self._asked(port).sentinel_get_master_addr_by_name(SERVICE)
            except redis.RedisError:
                continue
            said.append(int(address[1]) if address else None)
        agreed = [port for port in set(said) if port is not None and said.count(port) >= QUORUM]
        return agreed[0] if agreed else None

    def kill_master(self) -> None:
        """SIGKILL: no goodbye on any connection, no save, no hand-over."""
        self.master.kill()

    def stop(self) -> None:
        for process in self.sentinels:
            process.kill()
            process.wait(timeout=10)
        self.replica.kill()
        self.master.kill()
