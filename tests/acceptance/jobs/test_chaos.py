"""Chaos: 5,000 jobs over 2 worker processes while one is SIGKILLed and restarted every few seconds.

Every job must end terminal (succeeded), its result row must be published exactly once, nothing is
lost. ``TENURE_CHAOS_JOBS`` lowers the count for quick local runs only; the default is the issue's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from .procs import client, deployment, submit_chaos, wait_for

JOBS = int(os.environ.get("TENURE_CHAOS_JOBS", "5000"))
#: Seconds between SIGKILLs of the first worker.
KILL_EVERY_S = 2.5
#: Worker threads per process (the deployment default is 8).
THREADS = 8


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_chaos_every_job_completes_exactly_once(backend: str, tmp_path: Path) -> None:
    with deployment(backend, tmp_path) as d, client(d) as c:
        # Given: all jobs submitted (in batches, one transaction each)
        submit_chaos(d, c, JOBS)
        # When: two workers run them while the first is killed and restarted every few seconds
        d.start_relay()
        victim = d.start_worker(threads=THREADS)
        d.start_worker(threads=THREADS)
        kills = 0
        deadline = time.monotonic() + 540
        while d.scalar("SELECT count(*) FROM jobs WHERE status NOT IN ('succeeded', 'failed', 'cancelled', "
                       "'interrupted')") > 0:  # fmt: skip
            assert time.monotonic() < deadline, d.logs()
            time.sleep(KILL_EVERY_S)
            d.kill(victim)
            kills += 1
            victim = d.start_worker(threads=THREADS)
        # Then: every job succeeded, each result row exactly once, none lost
        wait_for("all jobs terminal", lambda: d.scalar("SELECT count(*) FROM jobs WHERE status = 'succeeded'") == JOBS,
                 30, d)  # fmt: skip
        d.assert_every_job_succeeded_once("chaos_runs", JOBS)
        assert kills >= 1
        retried = d.scalar("SELECT count(*) FROM jobs WHERE attempt > 1")
        print(f"chaos: {JOBS} jobs, {kills} SIGKILLs, {retried} jobs needed more than one attempt")
