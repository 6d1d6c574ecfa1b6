"""SIGKILL a real dramatiq worker mid-job: safe kinds run again (attempt 2), unsafe kinds end
interrupted, cancel-requested jobs end cancelled; a kind no worker knows ends failed."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import jobs
from jobs import CancelOutcome

from .procs import client, deployment, wait_for


@pytest.mark.timeout(120)
def test_sigkill_mid_job(backend: str, tmp_path: Path) -> None:
    with deployment(backend, tmp_path) as d, client(d) as c:
        # Given: worker A running three blocking jobs
        d.start_relay()
        worker_a = d.start_worker()
        safe = c.submit("acc_block_safe", payload={"block_attempts": 1})
        unsafe = c.submit("acc_block_unsafe", payload={"block_attempts": 1})
        cancel_me = c.submit("acc_block_safe", payload={"block_attempts": 99})
        ghost = c.submit("acc_ghost")
        ids = (safe.id, unsafe.id, cancel_me.id)
        wait_for(
            "three running jobs on worker A",
            lambda: (
                d.scalar(
                    "SELECT count(*) FROM jobs WHERE status = 'running' AND progress_message IS NOT NULL "
                    "AND id IN (:a, :b, :c)",
                    a=ids[0],
                    b=ids[1],
                    c=ids[2],
                )
                == 3
            ),
            60,
            d,
        )
        wait_for(
            "the ghost job to fail",
            lambda: d.scalar("SELECT status FROM jobs WHERE id = :i", i=ghost.id) == "failed",
            30,
            d,
        )
        assert d.scalar("SELECT error FROM jobs WHERE id = :i", i=ghost.id) == "no handler for kind acc_ghost"
        assert jobs.cancel(d.engine, cancel_me.id, by="u1").outcome == CancelOutcome.REQUESTED

        running_on = {
            r[0]: r[1]
            for r in d.rows("SELECT id, worker_id FROM jobs WHERE id IN (:a, :b, :c)", a=ids[0], b=ids[1], c=ids[2])
        }

        # When: worker A is SIGKILLed and worker B starts
        d.kill(worker_a)
        d.start_worker()

        # Then
        def settled() -> bool:
            statuses = {r[0]: r[1] for r in d.rows("SELECT id, status FROM jobs")}
            return (statuses[safe.id], statuses[unsafe.id], statuses[cancel_me.id]) == (
                "succeeded",
                "interrupted",
                "cancelled",
            )

        wait_for("recovery of all three jobs", settled, 60, d)
        rec = jobs.get_job(d.engine, safe.id, owner_id="u1")
        assert rec.attempt == 2 and rec.result == {"attempt": 2}
        interrupted = jobs.get_job(d.engine, unsafe.id, owner_id="u1")
        assert interrupted.attempt == 1 and "review" in (interrupted.error or "")
        assert jobs.get_job(d.engine, cancel_me.id, owner_id="u1").result is None
        # ... and each job's attempt 1 ended "lease lost", with worker A's host, and what came next
        lost = "lease lost — worker died"
        for job_id, expected in (
            (safe.id, [(1, lost, "requeued"), (2, "succeeded", None)]),
            (unsafe.id, [(1, lost, "interrupted")]),
            (cancel_me.id, [(1, lost, "cancelled")]),
        ):
            attempts = jobs.job_attempts(d.engine, job_id, owner_id="u1")
            assert [(a.attempt, a.outcome, a.next) for a in attempts] == expected, job_id
            assert attempts[0].host == socket.gethostname()
            (expiry,) = [e for e in jobs.job_events(d.engine, job_id, owner_id="u1") if e.type == "lease_expired"]
            assert (expiry.data["worker"], expiry.data["host"]) == (running_on[job_id], socket.gethostname()), expiry
        # the interrupted job can be retried by a person, as a new job
        again = jobs.retry(d.engine, unsafe.id, by="u1", registry=c.registry, settings=c.settings)
        assert again.retry_of_job_id == unsafe.id


@pytest.mark.timeout(60)
def test_workflow_runs_on_a_real_worker(backend: str, tmp_path: Path) -> None:
    with deployment(backend, tmp_path) as d, client(d) as c:
        d.start_relay()
        d.start_worker()
        parent = jobs.submit_workflow(
            d.engine,
            owner_id="u1",
            name="diamond",
            steps=[
                jobs.Step("a", "acc_echo", {"v": "a"}),
                jobs.Step("b", "acc_echo", {"v": "b"}, depends_on=["a"]),
                jobs.Step("c", "acc_echo", {"v": "c"}, depends_on=["a"]),
                jobs.Step("d", "acc_echo", {"v": "d"}, depends_on=["b", "c"]),
            ],
            registry=c.registry,
            settings=c.settings,
        )
        wait_for(
            "the workflow to succeed",
            lambda: d.scalar("SELECT status FROM jobs WHERE id = :i", i=parent.id) == "succeeded",
            45,
            d,
        )
        steps = jobs.workflow_steps(d.engine, parent.id, owner_id="u1")
        assert [s.status for s in steps] == ["succeeded"] * 4
        assert sorted(s.result["v"] for s in steps) == ["a", "b", "c", "d"]
