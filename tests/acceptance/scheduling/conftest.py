"""Real processes for the schedule acceptance tests: start, wait on rows, stop every one."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from jobs.schema import upgrade

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
APP = "tests.acceptance.scheduling.app"


@dataclass
class Fleet:
    """The database files of one test and the processes it started."""

    db: Path
    log_db: Path
    tmp: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TENURE_", "SCHED_TEST_"))}
        url = f"sqlite:///{self.db}"
        env.update(TENURE_BROKER_URL=url, TENURE_DATABASE_URL=url, SCHED_TEST_DB=str(self.db))
        env.update(SCHED_TEST_LOG=str(self.log_db), PYTHONUNBUFFERED="1")
        env.update(extra)
        return env

    def start(self, name: str, argv: list[str], **env: str) -> subprocess.Popen[bytes]:
        out = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 (closed when the test ends)
        # Its own process group: dramatiq forks worker processes, and stop()/kill() must reach them too.
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=self.env(**env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs.append(proc)
        return proc

    def scheduler(self, name: str, schedules: str) -> subprocess.Popen[bytes]:
        return self.start(name, [str(BIN / "periodiq"), APP], SCHED_TEST_SCHEDULES=schedules)

    def worker(self, name: str, queues: list[str], **env: str) -> subprocess.Popen[bytes]:
        argv = [str(BIN / "dramatiq"), f"{APP}:broker", "--processes", "1", "--threads", "2", "--queues", *queues]
        return self.start(name, argv, **env)

    def query(self, sql: str, *args: Any, log: bool = False) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.log_db if log else self.db, timeout=30) as conn:
            return conn.execute(sql, args).fetchall()

    def wait(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            for p in self.procs:
                if p.poll() is not None and p.returncode not in (-signal.SIGKILL, -signal.SIGTERM):
                    raise AssertionError(f"process {p.args} exited with {p.returncode}: {self.logs()}")
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout_s}s waiting for {what}: {self.logs()}")
            time.sleep(0.05)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.tmp.glob("*.log")))

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL *proc* and every process it forked (its process group)."""
        _signal_group(proc, signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        """SIGTERM every process group this test started; SIGKILL what is left after 10 s."""
        for p in self.procs:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(p, signal.SIGKILL)  # forked children outlive a main process that exited
            p.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


@pytest.fixture()
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    db = tmp_path / "tenure.db"
    upgrade(f"sqlite:///{db}")
    log_db = tmp_path / "log.db"
    with sqlite3.connect(log_db) as conn:
        conn.execute("CREATE TABLE log (kind TEXT, role TEXT, pid INTEGER, n INTEGER, at REAL)")
    f = Fleet(db, log_db, tmp_path)
    try:
        yield f
    finally:
        f.stop()
