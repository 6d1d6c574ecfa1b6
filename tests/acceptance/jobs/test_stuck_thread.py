"""A real worker whose job's thread is stuck in C code past its time limit: the job fails ``timed out —
still exiting``, a manual retry is refused while that thread runs, and allowed once it exits; a worker
that dies while the thread is stuck frees the job when its exit lease expires."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import jobs
from jobs import JobStillExiting

from .procs import Client, Deployment, client, deployment, wait_for


def _stuck_job(d: Deployment, c: Client, fifo: Path) -> str:
    """Submit an ``acc_stuck`` job (1 s time limit) and wait until its attempt timed out while stuck."""
    os.mkfifo(fifo)
    job = c.submit("acc_stuck", payload={"fifo": str(fifo)}, timeout_s=1)
    wait_for(
        "the stuck job to time out while still exiting",
        lambda: d.scalar("SELECT count(*) FROM job_exits WHERE job_id = :i", i=job.id) == 1,
        30,
        d,
    )
    return job.id


def _outcomes(d: Deployment, job_id: str) -> list[str]:
    return [a.outcome for a in jobs.job_attempts(d.engine, job_id, owner_id="u1")]


@pytest.mark.timeout(120)
def test_a_retry_waits_for_a_stuck_thread_to_exit(tmp_path: Path) -> None:
    with deployment("sqlite", tmp_path) as d, client(d) as c:
        worker = d.start_worker(threads=2)
        d.wait_ready(worker)
        # Given a job whose thread blocks in C code past its time limit
        fifo = tmp_path / "release"
        job_id = _stuck_job(d, c, fifo)
        record = jobs.get_job(d.engine, job_id, owner_id="u1")
        assert (record.status, record.error, record.still_exiting) == ("failed", "Job timed out.", True)
        assert _outcomes(d, job_id) == ["timed out — still exiting"]

        # When it is retried while the thread runs (its exit lease renewed past the lease TTL), then
        # Then the retry is refused with the reason
        with pytest.raises(JobStillExiting, match="still exiting"):
            jobs.retry(d.engine, job_id, by="u1", registry=c.registry, settings=c.settings)
        renewed = d.scalar("SELECT lease_expires_at FROM job_exits WHERE job_id = :i", i=job_id)
        wait_for(
            "an exit lease renewal",
            lambda: d.scalar("SELECT lease_expires_at FROM job_exits WHERE job_id = :i", i=job_id) > renewed,
            10,
            d,
        )
        with pytest.raises(JobStillExiting):
            jobs.retry(d.engine, job_id, by="u1", registry=c.registry, settings=c.settings)

        # When the thread is released (a writer opens the FIFO: the reader's open returns) and returns
        os.close(os.open(fifo, os.O_WRONLY))
        wait_for(
            "the thread's exit",
            lambda: d.scalar("SELECT count(*) FROM job_exits WHERE job_id = :i", i=job_id) == 0,
            30,
            d,
        )
        # Then the attempt reads "timed out", nothing it did afterwards was written, and a retry is made
        assert _outcomes(d, job_id) == ["timed out"]
        record = jobs.get_job(d.engine, job_id, owner_id="u1")
        assert (record.status, record.result, record.still_exiting) == ("failed", None, False)
        retry = jobs.retry(d.engine, job_id, by="u1", registry=c.registry, settings=c.settings)
        assert retry.created and retry.retry_of_job_id == job_id


@pytest.mark.timeout(120)
def test_a_worker_killed_with_a_stuck_thread_frees_the_job_when_its_exit_lease_expires(tmp_path: Path) -> None:
    with deployment("sqlite", tmp_path) as d, client(d) as c:
        worker = d.start_worker(threads=2)
        d.wait_ready(worker)
        # Given a timed-out job whose thread is still exiting
        job_id = _stuck_job(d, c, tmp_path / "never-released")
        with pytest.raises(JobStillExiting):
            jobs.retry(d.engine, job_id, by="u1", registry=c.registry, settings=c.settings)

        # When its worker is SIGKILLed, and another worker's recovery runs
        d.kill(worker)
        d.wait_ready(d.start_worker(threads=1))

        # Then the exit ends with the lease (recovery removes it) and the job can be retried
        wait_for(
            "recovery to end the expired exit",
            lambda: d.scalar("SELECT count(*) FROM job_exits WHERE job_id = :i", i=job_id) == 0,
            30,
            d,
        )
        assert _outcomes(d, job_id) == ["timed out"]
        assert jobs.retry(d.engine, job_id, by="u1", registry=c.registry, settings=c.settings).created
