"""The processes :mod:`bench.jobs_peers` starts (worker CLIs, Tenure's relay, schema tools, producers), and stopping
them by PID.

Every process gets ``BENCH_PEERS_RUN=<run id>`` in its environment and inherits it to its children; a PID is only
ever signalled while ``/proc/<pid>/environ`` still carries that marker, so a PID reused by someone else's process
is never touched. Worker commands run in their own session: a Ctrl-C in the terminal reaches the benchmark
only, which then stops them itself (SIGTERM, then SIGKILL of whatever is left, descendants included).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from bench.procs import REPO, alive, children_of

RUN_ENV = "BENCH_PEERS_RUN"
#: How long a stopped command gets to exit after SIGTERM before it is killed. Every job is done by then, and most
#: workers exit within 1-3 s; an RQ worker pool sometimes does not exit on SIGTERM at all (not investigated).
STOP_TIMEOUT_S = 10.0


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    for kid in children_of(pid):
        out.append(kid)
        out.extend(descendants(kid))
    return out


def carries_marker(pid: int, run_id: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{RUN_ENV}={run_id}".encode() in f.read().split(b"\0")
    except OSError:
        return False


class Launched:
    """One started command (and everything it forks), its output appended to *log*."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, run_id: str) -> None:
        self.argv = argv
        self.run_id = run_id
        self._log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self._log.write(f"\n$ {' '.join(argv)}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**env, RUN_ENV: run_id},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._known: set[int] = set()

    def check(self) -> None:
        """Raise if the command has exited (a worker must run until it is stopped)."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.argv[0]} exited early with code {self.proc.returncode}; see {self._log.name}")

    def note_children(self) -> None:
        self._known.update(descendants(self.proc.pid))

    def stop(self, timeout_s: float = STOP_TIMEOUT_S, *, signalled: bool = False) -> None:
        """SIGTERM the command (unless *signalled* already); SIGKILL it after *timeout_s*, then any of its known
        descendants still alive 5 s later."""
        self.note_children()
        if self.proc.poll() is None and not signalled:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        _kill_left(self._known, self.run_id)
        self._log.close()


def stop_all(launched: list[Launched], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM every command at once (they shut down side by side), then wait for each as :meth:`Launched.stop`."""
    for p in launched:
        p.note_children()
        if p.proc.poll() is None:
            p.proc.send_signal(signal.SIGTERM)
    for p in launched:
        p.stop(timeout_s, signalled=True)


def run_tool(argv: list[str], env: dict[str, str], log: Path, run_id: str, timeout_s: float = 300.0) -> str:
    """Run a short command to completion (schema installs, producers); its stdout, or an error with its log."""
    with open(log, "ab") as err:
        err.write(f"\n$ {' '.join(argv)}\n".encode())
        err.flush()
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**env, RUN_ENV: run_id},
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except BaseException:
            _kill_tool(proc, run_id)
            raise
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed with code {proc.returncode}; see {log}")
    return out.decode()


def _kill_tool(proc: subprocess.Popen[bytes], run_id: str) -> None:
    kids = descendants(proc.pid)
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    _kill_left(kids, run_id)


def _kill_left(pids: set[int] | list[int], run_id: str) -> None:
    """SIGKILL whichever of *pids* (still carrying this run's marker) is alive 5 s from now."""
    deadline = time.monotonic() + 5
    for pid in pids:
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid) and carries_marker(pid, run_id):
            os.kill(pid, signal.SIGKILL)
