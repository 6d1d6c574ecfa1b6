"""Starting and stopping real ``python -m dramatiq <app>`` worker processes (``bench.app`` unless told otherwise),
and reading their CPU time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def children_of(pid: int) -> list[int]:
    """Direct children of *pid* (from /proc; empty when it is gone)."""
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids.extend(int(x) for x in f.read().split())
        return kids
    except OSError:
        pass
    for entry in os.listdir("/proc"):  # fallback: scan ppid fields
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    kids.append(int(entry))
            except OSError:
                continue
    return kids


def cpu_ticks(pid: int) -> int:
    """utime + stime of *pid*, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5)


def cpu_ns(pid: int) -> int:
    """CPU time of all threads of *pid* in nanoseconds (sum of /proc/<pid>/task/*/schedstat; finer than ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            continue
    return total


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except OSError:
        return False


def _is_our_worker(pid: int, app: str = "bench.app") -> bool:
    """Guard against PID reuse: only a ``dramatiq <app>`` process is ever killed."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return app.encode() in argv


def stop_tree(proc: subprocess.Popen[bytes], known: set[int], is_ours: Callable[[int], bool], timeout_s: float) -> None:
    """SIGTERM a supervisor (it stops its children); after *timeout_s*, SIGKILL it, then SIGKILL by PID any
    known child still alive 5 s later — only if *is_ours* still recognises that PID (PID reuse)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    deadline = time.monotonic() + 5
    for pid in known:
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid) and is_ours(pid):
            os.kill(pid, signal.SIGKILL)


class Workers:
    """``python -m dramatiq <app> --processes P --threads T`` with the benchmark's broker settings.

    *app* is the worker module (default :mod:`bench.app`); *extra_env* adds variables it reads.
    """

    def __init__(
        self,
        url: str,
        options: dict[str, Any],
        ledger_dir: str,
        processes: int,
        threads: int,
        log_path: str,
        *,
        app: str = "bench.app",
        extra_env: dict[str, str] | None = None,
    ) -> None:
        env = dict(os.environ)
        env.update(
            BENCH_BROKER_URL=url,
            BENCH_BROKER_OPTIONS=json.dumps(options),
            BENCH_LEDGER_DIR=ledger_dir,
            PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        )
        env.update(extra_env or {})
        self.app = app
        self.processes = processes
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dramatiq", app, "--processes", str(processes), "--threads", str(threads)],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self._known: set[int] = set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def worker_pids(self) -> list[int]:
        kids = children_of(self.proc.pid)
        self._known.update(kids)
        return kids

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"dramatiq exited early with code {self.proc.returncode}; see {self._log.name}")

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the dramatiq master (it stops its workers); SIGKILL by PID whatever is left after *timeout_s*."""
        self.worker_pids()
        stop_tree(self.proc, self._known, lambda pid: _is_our_worker(pid, self.app), timeout_s)
        self._log.close()
