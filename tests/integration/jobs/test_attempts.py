"""Every attempt ends with what really happened: each recovery path of a lost lease, the claim that meets an
expired lease, the events recording the expiry, a stuck thread's exit lease (SQLite and PostgreSQL)."""

from __future__ import annotations

import socket
from datetime import UTC, datetime

import pytest

import jobs
from jobs import JobStillExiting
from jobs.attempts import attempts_from
from jobs.records import JobEventRecord

from .support import JobEnv


def _ended(env: JobEnv, job_id: str) -> list[tuple[int, str, str | None]]:
    return [(a.attempt, a.outcome, a.next) for a in jobs.job_attempts(env.engine, job_id, owner_id="u1")]


def _lost(env: JobEnv, kind: str, **submit: object) -> str:
    job = env.submit(kind, **submit)
    ctx = env.claim(job.id)
    assert ctx is not None
    env.age_lease(job.id)
    return job.id


@pytest.mark.parametrize(
    ("case", "next_", "status"),
    [
        ("safe", "requeued", "queued"),
        ("last attempt", "failed", "failed"),
        ("cancel requested", "cancelled", "cancelled"),
        ("external effects", "interrupted", "interrupted"),
    ],
)
def test_a_lost_lease_ends_the_attempt_lease_lost_and_says_what_came_next(
    env: JobEnv, case: str, next_: str, status: str
) -> None:
    env.declare("safe", lambda ctx: None)
    env.declare("unsafe", lambda ctx: None, safe_to_rerun=False)
    kind = "unsafe" if case == "external effects" else "safe"
    job_id = _lost(env, kind, **({"max_attempts": 1} if case == "last attempt" else {}))
    if case == "cancel requested":
        assert jobs.cancel(env.engine, job_id, by="u1").outcome == jobs.CancelOutcome.REQUESTED

    # When recovery finds the expired lease
    jobs.recover_expired(env.engine, broker=env.broker)

    # Then attempt 1 ended "lease lost", the job moved on, and the timeline says which worker and host
    assert _ended(env, job_id) == [(1, "lease lost — worker died", next_)]
    assert str(jobs.get_job(env.engine, job_id, owner_id="u1").status) == status
    events = jobs.job_events(env.engine, job_id, owner_id="u1")
    expiry, recovery = events[-2:]
    worker = env.mw.worker.worker_id
    assert (expiry.type, expiry.data["attempt"], expiry.data["worker"]) == ("lease_expired", 1, worker)
    assert expiry.data["host"] == socket.gethostname()
    assert datetime.fromisoformat(expiry.data["expired_at"]) == datetime.fromtimestamp(0.001, UTC)  # aged to 1 ms
    assert (recovery.type, recovery.data["status"], recovery.data["next"]) == ("status", status, next_)
    assert (recovery.data["reason"], recovery.data["worker"]) == ("lease expired", worker)


def test_a_claim_that_meets_an_expired_lease_records_the_lost_attempt_then_runs_the_next(env: JobEnv) -> None:
    env.declare("safe", lambda ctx: "done")
    job_id = _lost(env, "safe")
    other = env.worker()

    # When another worker's claim (a redelivered message) finds the job running under the expired lease
    ctx = env.claim(job_id, other)

    # Then it recovered it first (attempt 1: lease lost, requeued) and runs attempt 2
    assert ctx is not None and ctx.attempt == 2
    other.runner(ctx)
    assert _ended(env, job_id) == [(1, "lease lost — worker died", "requeued"), (2, "succeeded", None)]
    types = [e.type for e in jobs.job_events(env.engine, job_id, owner_id="u1")]
    assert types.count("lease_expired") == 1


def test_a_stuck_threads_exit_lease_holds_the_retry_until_it_expires(sqlite_env: JobEnv) -> None:
    env = sqlite_env
    env.declare("safe", lambda ctx: None)
    job = env.submit("safe")
    ctx = env.claim(job.id)
    assert ctx is not None
    env.mw.worker.track(ctx)  # running in this process (the runner tracks it while the actor runs)
    # Given the keeper failed the attempt past its timeout while its thread ran on
    env.mw.keeper._fail_overdue(ctx)
    with pytest.raises(JobStillExiting):
        jobs.retry(env.engine, job.id, by="u1", registry=env.registry, settings=env.settings)
    # ... and its renewals extend the exit lease
    before = env.sql("SELECT lease_expires_at FROM job_exits")[0][0]
    env.sql("UPDATE job_exits SET lease_expires_at = lease_expires_at - 60000")
    env.mw.keeper.renew_exits()
    assert env.sql("SELECT lease_expires_at FROM job_exits")[0][0] >= before

    # When its worker stops renewing it (it died) and the lease expires, a retry is allowed at once
    env.sql("UPDATE job_exits SET lease_expires_at = 1")
    assert _ended(env, job.id) == [(1, "timed out", None)]
    assert jobs.retry(env.engine, job.id, by="u1", registry=env.registry, settings=env.settings).created
    # ... and recovery removes the row; a late renewal of it finds nothing to hold
    jobs.recover_expired(env.engine, broker=env.broker)
    assert env.sql("SELECT count(*) FROM job_exits")[0][0] == 0
    env.mw.keeper.renew_exits()
    assert not ctx.exiting


def test_outcomes_of_events_written_before_outcomes_were_recorded_are_inferred() -> None:
    def status(seq: int, **data: object) -> JobEventRecord:
        return JobEventRecord("j", seq, "status", dict(data), datetime.fromtimestamp(seq, UTC))

    legacy = [
        status(1, status="queued"),
        status(2, status="running", attempt=1),
        status(3, status="queued", attempt=1, error="E"),  # a retry scheduled
        status(4, status="running", attempt=2),
        status(5, status="queued", reason="lease expired", attempt=2),
        status(6, status="running", attempt=3),
        status(7, status="running", attempt=4),  # the old claim over an expired lease
        status(8, status="succeeded", attempt=4),
    ]
    assert [(a.attempt, a.outcome, a.next) for a in attempts_from(legacy)] == [
        (1, "failed", "retry scheduled"),
        (2, "lease lost — worker died", "requeued"),
        (3, "lease lost — worker died", "requeued"),
        (4, "succeeded", None),
    ]
