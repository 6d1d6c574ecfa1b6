"""A cheap cross-process ledger for benchmark actors: one small mmap'd file per worker process.

Each worker process owns ``<dir>/ledger-<pid>.bin``:

* header ``<QddQ``: messages processed, wall time of the first and of the last one, latency samples;
* then up to :data:`LATENCY_CAPACITY` float64 samples of ``time.time() - stamp`` (enqueue→start).

Recording a message is a lock, two ``time.time()`` calls and one ``struct.pack_into`` into shared memory
(about a microsecond): no syscalls, no network, identical for every broker. The benchmark process reads
the files while the workers run (completion detection) and after they stop (latencies).

A *gate* lets the benchmark start all worker processes of a drain run at the same instant: until the file
``<dir>/go`` exists, the first actor call of each thread waits (its process is then visibly "ready" because
its ledger file exists). Drain time is measured from the moment ``go`` is created to the last message.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HEADER = struct.Struct("<QddQ")
SAMPLE = struct.Struct("<d")
#: Latency samples kept per process (the latency phase sends a few thousand messages).
LATENCY_CAPACITY = 65_536
FILE_SIZE = HEADER.size + SAMPLE.size * LATENCY_CAPACITY
GO_FILE = "go"


class LedgerWriter:
    """The worker-process side; create lazily (after fork) with :meth:`for_this_process`."""

    _instance: LedgerWriter | None = None
    _instance_lock = threading.Lock()

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.pid = os.getpid()
        path = os.path.join(directory, f"ledger-{self.pid}.bin")
        fd = os.open(path + ".tmp", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, FILE_SIZE)
            self._mm = mmap.mmap(fd, FILE_SIZE)
        finally:
            os.close(fd)
        os.replace(path + ".tmp", path)  # appears only once fully sized
        self._lock = threading.Lock()
        self._count = 0
        self._first = 0.0
        self._samples = 0
        self._go = False
        self._go_path = os.path.join(directory, GO_FILE)

    @classmethod
    def for_this_process(cls, directory: str) -> LedgerWriter:
        inst = cls._instance
        if inst is not None and inst.pid == os.getpid():
            return inst
        with cls._instance_lock:
            inst = cls._instance
            if inst is None or inst.pid != os.getpid():
                inst = cls._instance = cls(directory)
            return inst

    def wait_for_go(self) -> None:
        if self._go:
            return
        while not os.path.exists(self._go_path):
            time.sleep(0.001)
        self._go = True

    def record(self, stamp: float) -> None:
        now = time.time()
        with self._lock:
            if self._count == 0:
                self._first = now
            self._count += 1
            if stamp > 0 and self._samples < LATENCY_CAPACITY:
                SAMPLE.pack_into(self._mm, HEADER.size + SAMPLE.size * self._samples, now - stamp)
                self._samples += 1
            HEADER.pack_into(self._mm, 0, self._count, self._first, now, self._samples)


@dataclass
class ProcessTally:
    pid: int
    count: int
    first: float
    last: float
    samples: int


class LedgerReader:
    """The benchmark side: a directory of per-process ledgers plus the go gate."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        Path(directory).mkdir(parents=True, exist_ok=True)

    def reset(self) -> None:
        for p in Path(self.directory).iterdir():
            if p.name.startswith("ledger-") or p.name == GO_FILE:
                p.unlink()

    def open_gate(self) -> float:
        """Let waiting actors run; returns the wall time the gate opened."""
        t = time.time()
        Path(self.directory, GO_FILE).touch()
        return t

    def _files(self) -> list[Path]:
        return sorted(p for p in Path(self.directory).glob("ledger-*.bin"))

    def processes_ready(self) -> int:
        return len(self._files())

    def tallies(self) -> list[ProcessTally]:
        out = []
        for p in self._files():
            with open(p, "rb") as f:
                data = f.read(HEADER.size)
            if len(data) < HEADER.size:
                continue
            count, first, last, samples = HEADER.unpack(data)
            out.append(ProcessTally(int(p.stem.split("-")[1]), count, first, last, samples))
        return out

    def total(self) -> int:
        return sum(t.count for t in self.tallies())

    def latencies(self) -> list[float]:
        """Every recorded enqueue→start latency, in seconds."""
        values: list[float] = []
        for p in self._files():
            with open(p, "rb") as f:
                data = f.read()
            _, _, _, samples = HEADER.unpack_from(data, 0)
            values.extend(v for (v,) in SAMPLE.iter_unpack(data[HEADER.size : HEADER.size + SAMPLE.size * samples]))
        return values
