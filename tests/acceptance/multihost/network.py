"""Hosts for one test: a network namespace each, joined to this one by a veth pair (iproute2).

A host ``h`` gets the network ``10.<net>.<i>.0/24``: its own address ``.2`` inside its namespace,
and ``.1`` on this side, where the test forwards the services (PostgreSQL, Redis, which listen on
127.0.0.1 here) with socat. Prometheus, in this namespace, scrapes ``10.<net>.<i>.2``. A host's
processes are every process in its namespace (``ip netns pids``): killing the host kills all of
them, whatever their parentage. Needs root, ``ip`` and ``socat`` (``make test`` installs them:
scripts/install_network_tools.sh); :func:`require_tools` fails the test without them, and skips it only
when ``TENURE_TEST_SKIP_MULTIHOST=1`` asks for that. Everything made is removed by :meth:`Network.close`.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field

import pytest

from tests.acceptance.monitoring.support import Processes, wait_for

#: Set to 1 to skip the multi-host test where it cannot run (not root, no socat); unset, it fails there.
SKIP_ENV = "TENURE_TEST_SKIP_MULTIHOST"


def require_tools() -> None:
    """Fail (or skip, when :data:`SKIP_ENV` says so) unless this machine can run the hosts and Prometheus."""
    missing = [] if os.geteuid() == 0 else ["root (network namespaces)"]
    missing += [tool for tool in ("ip", "socat", "prometheus") if shutil.which(tool) is None]
    if not missing:
        return
    reason = f"the multi-host test needs {', '.join(missing)}"
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{reason}; skipped as {SKIP_ENV}=1 asks")
    pytest.fail(
        f"{reason}: `make test-deps` installs ip, socat and prometheus (as root); "
        f"set {SKIP_ENV}=1 to skip this test on purpose",
        pytrace=False,
    )


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@dataclass
class Host:
    name: str
    netns: str
    address: str
    gateway: str
    procs: Processes

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Run *argv* on this host (``ip netns exec`` execs it: the Popen is the process itself)."""
        return self.procs.start(f"{self.name}-{name}", ["ip", "netns", "exec", self.netns, *argv], env)

    def pids(self) -> list[int]:
        """Every live process of this host (zombies waiting for their reaper are not alive)."""
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True, timeout=10).stdout
        return [int(p) for p in out.split() if _state(int(p)) not in ("Z", None)]

    def signal_all(self, sig: int) -> list[int]:
        """Send *sig* to every process of the host until no new one appears; the pids signalled."""
        done: set[int] = set()
        while True:
            new = [p for p in self.pids() if p not in done]
            if not new:
                return sorted(done)
            for pid in new:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
                done.add(pid)

    def freeze(self) -> list[int]:
        """SIGSTOP every process of the host and wait until each one is stopped."""
        pids = self.signal_all(signal.SIGSTOP)
        wait_for(lambda: all(_state(p) in ("T", "Z", None) for p in pids), f"{self.name} frozen", 10)
        return pids

    def thaw(self, pids: list[int]) -> None:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL every process of the host; return once none is alive."""
        self.signal_all(signal.SIGKILL)
        for proc in self.procs.started:
            if proc.args[:4] == ["ip", "netns", "exec", self.netns]:
                try:
                    proc.wait(10)  # reap the ones this test started
                except subprocess.TimeoutExpired:
                    pass
        wait_for(lambda: not self.pids(), f"every process of {self.name} gone", 10)


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@dataclass
class Network:
    """The namespaces, veth pairs and forwarders of one test."""

    procs: Processes
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    net: int = field(default_factory=lambda: random.randint(100, 250))
    hosts: list[Host] = field(default_factory=list)

    def add_host(self, name: str) -> Host:
        i = len(self.hosts) + 1
        netns, outside, inside = f"tnr-{self.tag}-{name}", f"t{self.tag}{i}o", f"t{self.tag}{i}i"
        gateway, address = f"10.{self.net}.{i}.1", f"10.{self.net}.{i}.2"
        _ip("netns", "add", netns)
        host = Host(name, netns, address, gateway, self.procs)
        self.hosts.append(host)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", netns)
        _ip("addr", "add", f"{gateway}/24", "dev", outside)
        _ip("link", "set", outside, "up")
        _ip("netns", "exec", netns, "ip", "addr", "add", f"{address}/24", "dev", inside)
        _ip("netns", "exec", netns, "ip", "link", "set", inside, "up")
        _ip("netns", "exec", netns, "ip", "link", "set", "lo", "up")
        return host

    def forward(self, host: Host, port: int, target: str = "127.0.0.1") -> None:
        """Make ``target:port`` of this namespace reachable from *host* at ``host.gateway:port``."""
        self.procs.start(
            f"socat-{host.name}-{port}",
            ["socat", f"TCP-LISTEN:{port},bind={host.gateway},fork,reuseaddr", f"TCP:{target}:{port}"],
            dict(os.environ),
        )

    def wait_forwarded(self, host: Host, port: int) -> None:
        import socket

        def listening() -> bool:
            with socket.socket() as s:
                s.settimeout(1)
                return s.connect_ex((host.gateway, port)) == 0

        wait_for(listening, f"the forwarder {host.gateway}:{port}", 10)

    def close(self) -> None:
        """Stop every host (SIGTERM, then SIGKILL after 10 s), remove the namespaces and the veth pairs."""
        for host in self.hosts:
            host.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for host in self.hosts:
            while host.pids() and time.monotonic() < deadline:
                time.sleep(0.1)
            try:
                host.kill()
            except AssertionError:
                pass
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True, timeout=30)
        for i in range(1, len(self.hosts) + 1):
            subprocess.run(["ip", "link", "del", f"t{self.tag}{i}o"], capture_output=True, timeout=30)
