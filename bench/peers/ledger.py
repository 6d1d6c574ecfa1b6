"""What every peer's job writes when it starts: an append-only ledger that survives fork-per-job workers.

Standard library only: it is imported by the job functions of every system, in their own interpreters
(Oban's runs on Python 3.12 in its own virtualenv).

Each worker process appends one 16-byte record ``<dd`` (wall time the job started, the enqueue stamp it
carried, 0 when none) to ``<dir>/ledger-<key>.bin``, where *key* is the worker process: ``os.getpid()``, or
for a job run in a forked child (RQ's default ``Worker``, one work-horse per job) ``os.getppid()`` when
``BENCH_LEDGER_KEY=ppid``. One ``write(2)`` on an ``O_APPEND`` descriptor per job: writes of a few bytes to a
local file do not interleave, so threads and forked children need no lock. :mod:`bench.ledger`'s shared-memory
counter cannot serve here: it counts in process memory, which a work-horse loses when it exits.

The gate: a worker process's file appears when its first job starts; that job then waits until the file
``<dir>/go`` exists. The benchmark opens the gate once every worker process holds a job, so start-up time and
start-up skew stay out of the timed drain (:class:`LedgerReader`).
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

RECORD = struct.Struct("<dd")
GO_FILE = "go"
DIR_ENV = "BENCH_LEDGER_DIR"
KEY_ENV = "BENCH_LEDGER_KEY"

_fd: int | None = None
_fd_pid = 0
_go = False


def _key() -> int:
    return os.getppid() if os.environ.get(KEY_ENV) == "ppid" else os.getpid()


def started(stamp: float = 0.0) -> None:
    """Called first thing by every benchmark job: wait at the gate, then record the start (and *stamp*)."""
    global _fd, _fd_pid, _go
    directory = os.environ[DIR_ENV]
    if _fd is None or _fd_pid != os.getpid():
        _fd = os.open(os.path.join(directory, f"ledger-{_key()}.bin"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _fd_pid = os.getpid()
        _go = False
    if not _go:
        go = os.path.join(directory, GO_FILE)
        while not os.path.exists(go):
            time.sleep(0.001)
        _go = True
    os.write(_fd, RECORD.pack(time.time(), stamp))


class LedgerReader:
    """The benchmark's side of one ledger directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        for p in directory.iterdir():
            p.unlink()

    def _files(self) -> list[Path]:
        return sorted(self.directory.glob("ledger-*.bin"))

    def workers_ready(self) -> int:
        """Worker processes that have started a job (and wait at the gate until it opens)."""
        return len(self._files())

    def open_gate(self) -> float:
        """Let the waiting jobs run; returns the wall time the gate opened."""
        t = time.time()
        (self.directory / GO_FILE).touch()
        return t

    def total(self) -> int:
        """Jobs started so far (cheap: one ``stat`` per worker process)."""
        return sum(p.stat().st_size // RECORD.size for p in self._files())

    def records(self) -> list[tuple[float, float]]:
        """Every ``(started, stamp)`` recorded."""
        out: list[tuple[float, float]] = []
        for p in self._files():
            data = p.read_bytes()
            out.extend(RECORD.iter_unpack(data[: len(data) - len(data) % RECORD.size]))
        return out

    def latencies(self) -> list[float]:
        """``started - stamp`` in seconds, of every job that carried a stamp."""
        return [start - stamp for start, stamp in self.records() if stamp > 0]
