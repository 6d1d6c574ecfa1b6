"""cancel, retry, recovery and the web-layer queries."""

from __future__ import annotations

import random
import threading
import time

import pytest
from sqlalchemy import text

import jobs
from jobs import CancelOutcome, JobCancelled, JobContext, JobNotFound, JobNotRetryable
from jobs.db import make_engine
from jobs.execution.completer import Cancelled
from jobs.queries import JobFilter
from jobs.recovery import recover_expired
from jobs.store import now_ms
from jobs.transitions import INTERRUPTED_HINT

from .support import JobEnv, observed


def _pending_messages(env: JobEnv) -> int:
    if env.backend == "sqlite":
        return env.sql("SELECT count(*) FROM broker_messages")[0][0]
    return env.sql("SELECT count(*) FROM outbox")[0][0]


# -- cancel --------------------------------------------------------------------------------------------
def test_cancel_queued_is_immediate_and_its_message_is_skipped(env: JobEnv) -> None:
    env.declare("noop", lambda ctx: None)
    job = env.submit("noop")
    result = jobs.cancel(env.engine, job.id, by="u1")
    assert result.outcome == CancelOutcome.CANCELLED and result.job.status == "cancelled"
    assert result.job.completed_at is not None
    assert env.claim(job.id) is None  # its message, when delivered, matches nothing
    again = jobs.cancel(env.engine, job.id, by="u1")
    assert again.outcome == CancelOutcome.ALREADY_FINISHED and "already finished" in again.message


def test_cancel_running_then_again(env: JobEnv) -> None:
    env.declare("noop", lambda ctx: None)
    job = env.submit("noop")
    assert env.claim(job.id) is not None
    assert jobs.cancel(env.engine, job.id, by="u1").outcome == CancelOutcome.REQUESTED
    assert jobs.cancel(env.engine, job.id, by="u1").outcome == CancelOutcome.ALREADY_REQUESTED


def test_succeeded_never_becomes_cancelled(env: JobEnv) -> None:
    env.declare("noop", lambda ctx: 1)
    job = env.submit("noop")
    ctx = env.claim(job.id)
    assert ctx is not None
    env.mw.runner(ctx)
    result = jobs.cancel(env.engine, job.id, by="u1", is_admin=True)
    assert result.outcome == CancelOutcome.ALREADY_FINISHED and result.job.status == "succeeded"
    assert not result.job.cancel_requested


def test_cancel_of_another_owners_job_is_not_found(env: JobEnv) -> None:
    env.declare("noop", lambda ctx: None)
    job = env.submit("noop")
    with pytest.raises(JobNotFound):
        jobs.cancel(env.engine, job.id, by="intruder")
    with pytest.raises(JobNotFound):
        jobs.cancel(env.engine, "0" * 32, by="u1")
    assert env.row(job.id).status == "queued"


# -- retry ---------------------------------------------------------------------------------------------
def test_retry_creates_a_new_job_linked_to_the_old(env: JobEnv) -> None:
    def fails(ctx: JobContext, *, x: int) -> None:
        raise ValueError("no")

    env.declare("fails", fails, never_retry=(ValueError,))
    job = env.submit("fails", payload={"x": 7}, resource=("rec", "9"))
    ctx = env.claim(job.id)
    assert ctx is not None
    env.mw.runner(ctx)
    new = jobs.retry(env.engine, job.id, by="u1", registry=env.registry, settings=env.settings)
    assert new.id != job.id and new.retry_of_job_id == job.id and new.created
    assert new.status == "queued" and new.attempt == 0 and (new.resource_type, new.resource_id) == ("rec", "9")
    assert env.row(new.id).payload == env.row(job.id).payload
    assert env.row(job.id).status == "failed"


def test_a_job_is_retried_once_even_when_asked_again_at_the_same_time(env: JobEnv) -> None:
    # Given a cancelled job
    env.declare("noop", lambda ctx: None)
    job = env.submit("noop")
    jobs.cancel(env.engine, job.id, by="u1")

    # When eight threads retry it at once (a double click, two operators, overlapping bulk retries)
    barrier = threading.Barrier(8)
    answers: list[jobs.JobRecord] = []

    def retry() -> None:
        barrier.wait()
        answers.append(jobs.retry(env.engine, job.id, by="u1", registry=env.registry, settings=env.settings))

    threads = [threading.Thread(target=retry) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    # Then one new job exists, every answer is that job, and only one answer created it
    assert len(answers) == 8 and len({a.id for a in answers}) == 1
    assert sum(1 for a in answers if a.created) == 1
    assert env.sql("SELECT count(*) FROM jobs WHERE retry_of_job_id = :j", j=job.id)[0][0] == 1
    # and asking later still answers that retry, not a new one
    again = jobs.retry(env.engine, job.id, by="u1", registry=env.registry, settings=env.settings)
    assert again.id == answers[0].id and not again.created
    # while the retry itself, once finished, can be retried (the chain goes on from its newest job)
    jobs.cancel(env.engine, again.id, by="u1")
    third = jobs.retry(env.engine, again.id, by="u1", registry=env.registry, settings=env.settings)
    assert third.created and third.retry_of_job_id == again.id


@pytest.mark.parametrize("state", ["queued", "running", "succeeded"])
def test_retry_refused_unless_finished_unsuccessfully(env: JobEnv, state: str) -> None:
    env.declare("noop", lambda ctx: None)
    job = env.submit("noop")
    if state != "queued":
        ctx = env.claim(job.id)
        assert ctx is not None
        if state == "succeeded":
            env.mw.runner(ctx)
    with pytest.raises(JobNotRetryable):
        jobs.retry(env.engine, job.id, by="u1", registry=env.registry, settings=env.settings)


def test_retry_of_another_owners_job_is_not_found(env: JobEnv) -> None:
    env.declare("noop", lambda ctx: None)
    job = env.submit("noop")
    jobs.cancel(env.engine, job.id, by="u1")
    with pytest.raises(JobNotFound):
        jobs.retry(env.engine, job.id, by="u2", registry=env.registry, settings=env.settings)


# -- recovery ------------------------------------------------------------------------------------------
def _running(env: JobEnv, kind: str, **submit_kwargs: object) -> str:
    job = env.submit(kind, **submit_kwargs)
    assert env.claim(job.id) is not None
    return job.id


def test_recovery_per_kind_and_cancel_request(env: JobEnv) -> None:
    env.declare("safe", lambda ctx: None)
    env.declare("unsafe", lambda ctx: None, safe_to_rerun=False)
    safe, unsafe, cancelled = _running(env, "safe"), _running(env, "unsafe"), _running(env, "safe")
    last = _running(env, "safe", max_attempts=1)
    jobs.cancel(env.engine, cancelled, by="u1")
    live = _running(env, "safe")
    messages = _pending_messages(env)
    for job_id in (safe, unsafe, cancelled, last):
        env.age_lease(job_id)
    report = recover_expired(env.engine, broker=env.broker)
    assert (report.requeued, report.interrupted, report.cancelled, report.failed) == (1, 1, 1, 1)
    assert env.row(safe).status == "queued" and env.row(safe).attempt == 1
    assert env.row(unsafe).status == "interrupted" and env.row(unsafe).error == INTERRUPTED_HINT
    assert env.row(cancelled).status == "cancelled"
    assert env.row(last).status == "failed"
    assert env.row(live).status == "running"
    assert _pending_messages(env) == messages + 1  # a fresh message for the requeued job only
    ctx = env.claim(safe)
    assert ctx is not None and ctx.attempt == 2
    assert recover_expired(env.engine, broker=env.broker).total == 0


def test_recovery_boundary_just_expired_vs_not_yet(env: JobEnv) -> None:
    env.declare("safe", lambda ctx: None)
    job_id = _running(env, "safe")
    expires = env.row(job_id).lease_expires_at
    assert expires is not None
    assert recover_expired(env.engine, expires, broker=env.broker).total == 0  # not expired at its expiry
    assert recover_expired(env.engine, expires + 1, broker=env.broker).requeued == 1


def test_claim_of_expired_unsafe_job_interrupts_it(env: JobEnv) -> None:
    env.declare("unsafe", lambda ctx: None, safe_to_rerun=False)
    job_id = _running(env, "unsafe")
    env.age_lease(job_id)
    assert env.claim(job_id, env.worker()) is None
    assert env.row(job_id).status == "interrupted"


# -- queries -------------------------------------------------------------------------------------------
def test_queries_scope_by_owner(env: JobEnv) -> None:
    env.declare("noop", lambda ctx: None)
    mine = [env.submit("noop", owner_id="alice") for _ in range(3)]
    theirs = env.submit("noop", owner_id="bob")
    listed = jobs.list_jobs(env.engine, owner_id="alice")
    # newest first; jobs created in the same millisecond are ordered by id
    assert {j.id for j in listed} == {j.id for j in mine}
    assert listed == sorted(listed, key=lambda j: (j.created_at, j.id), reverse=True)
    page = jobs.list_jobs(env.engine, owner_id="alice", limit=2)
    rest = jobs.list_jobs(env.engine, owner_id="alice", before=page[-1])
    assert [j.id for j in page + rest] == [j.id for j in listed]
    assert len(jobs.list_jobs(env.engine, owner_id="admin", is_admin=True)) == 4
    assert jobs.list_jobs(env.engine, owner_id="alice", where=JobFilter(statuses=("running",))) == []
    with pytest.raises(JobNotFound):
        jobs.get_job(env.engine, theirs.id, owner_id="alice")
    with pytest.raises(JobNotFound):
        jobs.job_events(env.engine, theirs.id, owner_id="alice")
    assert jobs.get_job(env.engine, theirs.id, owner_id="x", is_admin=True).owner_id == "bob"
    fields = set(jobs.JobRecord.__dataclass_fields__)
    assert not fields & {"payload", "config", "worker_id", "lease_expires_at", "request_digest"}


# -- publish vs cancel ---------------------------------------------------------------------------------
RACES = 200


def test_cancel_vs_result_commit_races_have_one_winner(env: JobEnv) -> None:
    env.sql("CREATE TABLE domain_rows (job_id VARCHAR(32), note VARCHAR(100))")
    env.declare("publisher", lambda ctx: None)
    outcomes = {"succeeded": 0, "cancelled": 0}
    # The cancelling side contends in the database itself, as another process would (no in-process
    # writer queue in front of SQLite's lock); small random head starts let either side win.
    other = make_engine(env.url, serialize_writers=False)
    for _ in range(RACES):
        job = env.submit("publisher")
        ctx = env.claim(job.id)
        assert ctx is not None
        barrier = threading.Barrier(2)
        seen: dict[str, object] = {}

        def publish(ctx: JobContext = ctx, barrier: threading.Barrier = barrier, seen: dict = seen) -> None:
            barrier.wait()
            time.sleep(random.uniform(0, 0.001))
            try:
                with ctx.result_transaction() as tx:
                    tx.connection.execute(text("INSERT INTO domain_rows VALUES (:j, 'r')"), {"j": ctx.job_id})
                    tx.complete({"ok": True})
                seen["publish"] = "committed"
            except JobCancelled:
                seen["publish"] = "cancelled"

        def cancel(job_id: str = job.id, barrier: threading.Barrier = barrier, seen: dict = seen) -> None:
            barrier.wait()
            time.sleep(random.uniform(0, 0.001))
            seen["cancel"] = jobs.cancel(other, job_id, by="u1").outcome

        threads = [threading.Thread(target=publish), threading.Thread(target=cancel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        if seen["publish"] == "cancelled":
            env.mw.runner.record(ctx, Cancelled())
        row = env.row(job.id)
        rows = env.sql("SELECT count(*) FROM domain_rows WHERE job_id = :j", j=job.id)[0][0]
        if row.status == "succeeded":
            assert seen == {"publish": "committed", "cancel": CancelOutcome.ALREADY_FINISHED}
            assert row.result is not None and rows == 1 and row.cancel_requested_at is None
        else:
            assert row.status == "cancelled"
            assert seen == {"publish": "cancelled", "cancel": CancelOutcome.REQUESTED}
            assert row.result is None and rows == 0
        outcomes[row.status] += 1
    other.dispose()
    assert min(outcomes.values()) > 0, f"the races never went both ways: {outcomes}"
    assert sum(outcomes.values()) == RACES


def test_lifecycle_events_only_after_commit_and_carry_no_payload(env: JobEnv) -> None:
    env.declare("noop", lambda ctx, **payload: None)
    with observed() as seen:
        job = env.submit("noop", payload={"secret": "s3cr3t"})
        ctx = env.claim(job.id)
        assert ctx is not None
        env.mw.runner(ctx)
    assert [(f["job_id"], f["event"], f["attempt"]) for f in seen] == [
        (job.id, "job.queued", 0),
        (job.id, "job.started", 1),
        (job.id, "job.completed", 1),
    ]
    assert "s3cr3t" not in repr(seen)
    assert now_ms() > 0
