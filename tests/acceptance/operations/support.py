"""Process helpers for the operations tests: every process runs in its own process group, logs to a
file in the test's directory, and is stopped (SIGTERM, then SIGKILL) by group when the test ends."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[3]
T = TypeVar("T")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Procs:
    tmp: Path
    started: list[Proc] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict[str, str], cwd: Path = ROOT) -> Proc:
        log = self.tmp / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        proc = Proc(name, popen, log)
        self.started.append(proc)
        return proc

    def signal(self, proc: Proc, sig: int, *, group: bool = False) -> None:
        try:
            if group:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop_all(self) -> None:
        """SIGTERM every group still alive, then SIGKILL whatever is left after 10 s."""
        for proc in self.started:
            self.signal(proc, signal.SIGTERM, group=True)
        deadline = time.monotonic() + 10
        for proc in self.started:
            try:
                proc.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # the group may outlive its leader (a child that ignored SIGTERM): kill what is left
            self.signal(proc, signal.SIGKILL, group=True)
            if proc.popen.poll() is None:
                proc.popen.wait(10)

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.output()[-4000:]}" for p in self.started)


@contextmanager
def processes(tmp: Path) -> Iterator[Procs]:
    procs = Procs(tmp)
    try:
        yield procs
    finally:
        procs.stop_all()


def wait_for(
    what: str, probe: Callable[[], T], timeout_s: float, procs: Procs | None = None, poll_s: float = 0.02
) -> T:
    """Poll *probe* (a row count, a log line) until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{procs.logs() if procs else ''}")
        time.sleep(poll_s)


def group_alive(pgid: int) -> bool:
    """Whether any process of the process group *pgid* is still alive (zombies count as gone)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False
