"""Hosts of a test's own on one machine: network namespaces plugged into a switch (a bridge in a namespace
of its own), each at an address of a private /24 picked per run, and the test's own namespace plugged in
too (its receiver and its producer run there). A host's cable is pulled and plugged in again by setting its
switch port down and up: its packets then vanish, as on a real cut, instead of being refused.

Every namespace and link is named after the run, so two runs never collide, and the `with` block deletes
them all, with whatever still runs in them, however it ends. Making namespaces needs root and `ip`."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import uuid

# 10.213.<n>.0/24: one private /24 per run, a free one picked at random.
PREFIX = "10.213"
OWN = 254  # the test's own address in it


def ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def why_not() -> str | None:
    """Why network namespaces cannot be made here; None where they can."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not on PATH"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    probe = f"promesa-probe-{uuid.uuid4().hex[:8]}"
    try:
        ip("netns", "add", probe)
    except RuntimeError as refused:
        return f"`ip netns add` is refused here ({refused})"
    ip("netns", "del", probe)
    return None


def _free_subnet() -> str:
    used = ip("-4", "-o", "addr") + ip("-4", "route")
    free = [n for n in range(1, 254) if f" {PREFIX}.{n}." not in used]
    return f"{PREFIX}.{random.choice(free)}"


class Network:
    """`hosts`: their names, short (a switch port is named after each). `address[host]`, `own_address`."""

    def __init__(self, hosts: list[str]):
        self.run = f"pm{uuid.uuid4().hex[:8]}"
        self.subnet = _free_subnet()
        self.cidr = f"{self.subnet}.0/24"
        self.address = {host: f"{self.subnet}.{n}" for n, host in enumerate(hosts, 1)}
        self.own_address = f"{self.subnet}.{OWN}"
        self.switch = self.namespace("switch")
        self.made: list[str] = []
        self.more: list[str] = []  # addresses added to hosts

    def namespace(self, host: str) -> str:
        return f"{self.run}-{host}"

    def run_in(self, host: str) -> tuple[str, ...]:
        """The command prefix that runs a program on this host."""
        return ("ip", "netns", "exec", self.namespace(host))

    def __enter__(self) -> Network:
        try:
            self._make()
        except BaseException:
            self._delete()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._delete()

    def _make(self) -> None:
        self._add_namespace(self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        for host, address in self.address.items():
            namespace = self.namespace(host)
            self._add_namespace(namespace)
            ip("link", "add", "eth0", "netns", namespace, "type", "veth", "peer", "name", self._port(host),
               "netns", self.switch)
            self._plug(self._port(host))
            ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
            ip("-n", namespace, "link", "set", "eth0", "up")
            ip("-n", namespace, "link", "set", "lo", "up")
        # The test's own end: deleted with its peer when the switch's namespace goes.
        ip("link", "add", self.run, "type", "veth", "peer", "name", "port-test", "netns", self.switch)
        self._plug("port-test")
        ip("addr", "add", f"{self.own_address}/24", "dev", self.run)
        ip("link", "set", self.run, "up")

    def _add_namespace(self, namespace: str) -> None:
        ip("netns", "add", namespace)
        self.made.append(namespace)
        ip("-n", namespace, "link", "set", "lo", "up")

    def _plug(self, port: str) -> None:
        ip("-n", self.switch, "link", "set", "dev", port, "master", "br0")
        ip("-n", self.switch, "link", "set", "dev", port, "up")

    @staticmethod
    def _port(host: str) -> str:
        return f"port-{host}"

    def pull_cable(self, host: str) -> None:
        """The host's switch port down: whatever it sends or is sent vanishes."""
        ip("-n", self.switch, "link", "set", "dev", self._port(host), "down")

    def plug_in(self, host: str) -> None:
        ip("-n", self.switch, "link", "set", "dev", self._port(host), "up")

    def silence(self, host: str) -> None:
        """The host's cable pulled, while every other host keeps its hardware address, as hosts behind a router
        keep the router's: what is sent to it vanishes and nothing answers. Without that, a sender that has to
        resolve its address anew gets "no route to host" 3 s later (ARP unanswered): a refusal, not a drop."""
        address = self.address[host]
        mac = json.loads(ip("-j", "-n", self.namespace(host), "link", "show", "eth0"))[0]["address"]
        for namespace, device in self._neighbours(host):
            ip(*namespace, "neigh", "replace", address, "lladdr", mac, "dev", device, "nud", "permanent")
        self.pull_cable(host)

    def unsilence(self, host: str) -> None:
        self.plug_in(host)
        for namespace, device in self._neighbours(host):
            ip(*namespace, "neigh", "del", self.address[host], "dev", device)

    def _neighbours(self, host: str) -> list[tuple[tuple[str, ...], str]]:
        """The other hosts' (and the test's own) `ip` options and device, to set their neighbour tables."""
        return [*((("-n", self.namespace(other)), "eth0") for other in self.address if other != host), ((), self.run)]

    def add_address(self, host: str) -> str:
        """One more address for the host (a second service on it, to be cut off alone)."""
        taken = set(self.address.values()) | {self.own_address, *self.more}
        address = next(f"{self.subnet}.{n}" for n in range(100, OWN) if f"{self.subnet}.{n}" not in taken)
        ip("-n", self.namespace(host), "addr", "add", f"{address}/24", "dev", "eth0")
        self.more.append(address)
        return address

    def blackhole(self, host: str, address: str) -> None:
        """The host's packets to that address are dropped (and its new connections there refused at once)."""
        ip("-n", self.namespace(host), "route", "add", "blackhole", f"{address}/32")

    def unblackhole(self, host: str, address: str) -> None:
        ip("-n", self.namespace(host), "route", "del", "blackhole", f"{address}/32")

    def _delete(self) -> None:
        for namespace in reversed(self.made):
            pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout
            for pid in pids.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        self.made.clear()
        subprocess.run(["ip", "link", "del", self.run], capture_output=True)  # gone already, unless half made
