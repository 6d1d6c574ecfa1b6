"""A ``dramatiq tasks:compose`` worker killed with SIGKILL leaves a marker; the next worker start reports it once."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from broker import SQLiteBroker
from jobs.schema import upgrade

from .support import ROOT, Proc, processes, wait_for

REPORT = re.compile(
    r"(\d+) consumer process\(es\) ended uncleanly \(killed or crashed\) since (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC)"
)


@pytest.mark.timeout(120)
def test_a_sigkilled_worker_is_reported_by_the_next_start_once(tmp_path: Path) -> None:
    db = tmp_path / "tenure.db"
    url = f"sqlite:///{db}"
    upgrade(url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env.update(
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        TENURE_DATABASE_URL=url,
        TENURE_BROKER_URL=url,
        TENURE_OUTPUT_ROOT=str(tmp_path / "outputs"),
    )
    argv = [sys.executable, "-m", "dramatiq", "tasks:compose", "--processes", "1", "--threads", "1"]
    argv += ["--queues", "maintenance"]

    def consumers() -> list[tuple[str, int, int]]:
        conn = sqlite3.connect(db, timeout=30)
        try:
            return conn.execute("SELECT owner, pid, started_at FROM broker_processes").fetchall()
        finally:
            conn.close()

    with processes(tmp_path) as procs:
        # Given a worker whose consumer process registered
        first = procs.start("first", argv, env)
        ((owner, killed_pid, started_at),) = wait_for("the first worker to register", consumers, 60, procs)

        # When it is killed with SIGKILL (process group: main and worker processes)
        procs.signal(first, signal.SIGKILL, group=True)
        first.popen.wait(10)

        # Then the next start logs one unclean exit since the killed process started
        def report_in(proc: Proc) -> re.Match[str] | None:
            return REPORT.search(proc.output())

        second = procs.start("second", argv, env)
        found = wait_for("the unclean-exit report", lambda: report_in(second), 60, procs)
        assert found.group(1) == "1"
        assert found.group(2) == time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started_at / 1000))
        broker = SQLiteBroker(url, middleware=[])
        try:
            (exit_,) = broker.unclean_exits()
        finally:
            broker.close()
        assert (exit_["owner"], exit_["pid"], exit_["started_at"]) == (owner, killed_pid, started_at)
        assert exit_["reported_at"] is not None and exit_["detected_at"] >= started_at

        # ... and only once: a clean stop and a third start report nothing more
        wait_for("the second worker to register", lambda: len(consumers()) == 1, 60, procs)
        procs.signal(second, signal.SIGTERM)
        assert second.popen.wait(30) == 0, procs.logs()
        third = procs.start("third", argv, env)
        wait_for("the third worker to register", lambda: len(consumers()) == 1, 60, procs)
        assert report_in(third) is None
        assert "ended uncleanly" not in third.output()
