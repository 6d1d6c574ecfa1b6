"""Execution binding in-process: claim, outcomes, retries, timeouts, unknown kinds, outputs, fencing."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from dramatiq.message import Message
from dramatiq.middleware import SkipMessage

import jobs
from jobs import JobCancelled, JobContext, StaleAttempt
from jobs.execution.binding import JobMiddleware
from jobs.publish import job_message
from jobs.registry import Registry

from .support import JobEnv


def _run(env: JobEnv, job_id: str, mw: JobMiddleware | None = None) -> JobContext:
    ctx = env.claim(job_id, mw)
    assert ctx is not None, "the job should have been claimable"
    (mw or env.mw).runner(ctx)
    return ctx


def _statuses(env: JobEnv, job_id: str) -> list[tuple[int, str, Any]]:
    return [(e.sequence, e.type, e.data.get("status")) for e in jobs.job_events(env.engine, job_id, owner_id="u1")]


def test_success_records_result_progress_and_gap_free_events(env: JobEnv) -> None:
    def work(ctx: JobContext, *, n: int) -> dict[str, int]:
        ctx.progress(0.5, "half way")
        assert ctx.event("step", i=1) == 3
        ctx.check_cancelled()
        return {"double": 2 * n}

    env.declare("work", work)
    job = env.submit("work", payload={"n": 21})
    _run(env, job.id)
    rec = jobs.get_job(env.engine, job.id, owner_id="u1")
    assert rec.status == "succeeded" and rec.result == {"double": 42} and rec.attempt == 1
    assert rec.progress == 1.0 and rec.progress_message == "half way" and rec.completed_at is not None
    assert _statuses(env, job.id) == [(1, "status", "queued"), (2, "status", "running"), (3, "step", None),
                                      (4, "status", "succeeded")]  # fmt: skip
    assert [e.sequence for e in jobs.job_events(env.engine, job.id, owner_id="u1", after=2)] == [3, 4]


def test_duplicate_delivery_is_skipped(env: JobEnv) -> None:
    env.declare("noop", lambda ctx: None)
    job = env.submit("noop")
    ctx = env.claim(job.id)
    assert ctx is not None
    assert env.claim(job.id, env.worker()) is None  # running under a live lease
    env.mw.runner(ctx)
    assert env.claim(job.id) is None  # terminal
    assert env.row(job.id).attempt == 1


def test_error_retries_same_job_with_backoff_then_succeeds(env: JobEnv) -> None:
    def flaky(ctx: JobContext) -> str:
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails, password=hunter2")
        return "ok"

    env.declare("flaky", flaky, backoff=lambda attempt: 5.0)
    job = env.submit("flaky")
    _run(env, job.id)
    row = env.row(job.id)
    assert row.status == "queued" and row.attempt == 1
    assert row.error is not None and "hunter2" not in row.error and "first attempt fails" in row.error
    assert row.run_after >= row.updated_at + 5000
    if env.backend == "sqlite":  # the retry message was written in the same transaction, delayed
        etas = [r[0] for r in env.sql("SELECT eta FROM broker_messages ORDER BY id")]
        assert len(etas) == 2 and etas[1] >= row.updated_at + 5000
    else:
        assert env.sql("SELECT count(*) FROM outbox")[0][0] == 2
    _run(env, job.id)
    rec = jobs.get_job(env.engine, job.id, owner_id="u1")
    assert rec.status == "succeeded" and rec.attempt == 2 and rec.result == "ok" and rec.error is None


def test_attempts_exhausted_and_never_retry(env: JobEnv) -> None:
    def always(ctx: JobContext) -> None:
        raise RuntimeError("always")

    def invalid(ctx: JobContext) -> None:
        raise ValueError("bad input")

    env.declare("always", always, backoff=lambda a: 0)
    env.declare("invalid", invalid, never_retry=(ValueError,))
    job = env.submit("always", max_attempts=2)
    _run(env, job.id)
    _run(env, job.id)
    rec = jobs.get_job(env.engine, job.id, owner_id="u1")
    assert rec.status == "failed" and rec.attempt == 2 and rec.error == "RuntimeError: always"
    assert env.claim(job.id) is None
    job = env.submit("invalid")
    _run(env, job.id)
    rec = jobs.get_job(env.engine, job.id, owner_id="u1")
    assert rec.status == "failed" and rec.attempt == 1 and rec.error == "ValueError: bad input"


def test_final_failures_log_one_line_and_unexpected_ones_a_traceback(
    env: JobEnv, caplog: pytest.LogCaptureFixture
) -> None:
    def invalid(ctx: JobContext) -> None:
        raise ValueError("bad input token=hunter2")

    def broken(ctx: JobContext) -> None:
        raise RuntimeError("a bug")

    env.declare("invalid", invalid, never_retry=(ValueError,))
    env.declare("broken", broken, backoff=lambda a: 0)
    bad, bug = env.submit("invalid"), env.submit("broken", max_attempts=1)
    with caplog.at_level(logging.INFO, logger="jobs.execution.runner"):
        _run(env, bad.id)
        _run(env, bug.id)
    final = [r for r in caplog.records if bad.id in r.getMessage()]
    unexpected = [r for r in caplog.records if bug.id in r.getMessage()]
    assert [r.getMessage() for r in final] == [f"Job {bad.id} attempt 1 failed: ValueError: bad input token=***"]
    assert not final[0].exc_info and "hunter2" not in caplog.text
    assert len(unexpected) == 1 and unexpected[0].exc_info
    # At DEBUG the final failure's traceback is there too.
    again = env.submit("invalid", idempotency_key="again")
    with caplog.at_level(logging.DEBUG, logger="jobs.execution.runner"):
        _run(env, again.id)
    assert [bool(r.exc_info) for r in caplog.records if again.id in r.getMessage()] == [True]


def test_unserialisable_result_fails_the_attempt(env: JobEnv) -> None:
    env.declare("weird", lambda ctx: object(), never_retry=(TypeError,))
    job = env.submit("weird")
    _run(env, job.id)
    rec = jobs.get_job(env.engine, job.id, owner_id="u1")
    assert rec.status == "failed" and "JSON" in (rec.error or "")


def test_timeout_fails_with_fixed_message(tmp_path: Path) -> None:
    from .support import job_env

    with job_env("sqlite", tmp_path, job_lease_ttl_s=0.6) as env:

        def slow(ctx: JobContext) -> None:
            for _ in range(200):  # interruptible: the timeout arrives between bytecodes
                time.sleep(0.02)

        env.declare("slow", slow)
        job = env.submit("slow", timeout_s=1)
        env.mw.start_keeper(env.broker)
        try:
            started = time.monotonic()
            _run(env, job.id)
            assert time.monotonic() - started < 3
        finally:
            env.mw.stop()
        rec = jobs.get_job(env.engine, job.id, owner_id="u1")
        assert rec.status == "failed" and rec.error == "Job timed out." and rec.attempt == 1


def test_message_for_unknown_kind_fails_the_job(env: JobEnv) -> None:
    env.declare("known", lambda ctx: None)
    job = env.submit("known")
    stranger = JobMiddleware(env.settings, engine=env.engine, registry=Registry(), check_schema=False)
    message = job_message(job.id, "known", "default")
    with pytest.raises(SkipMessage):
        stranger.before_process_message(env.broker, message)
    rec = jobs.get_job(env.engine, job.id, owner_id="u1")
    assert rec.status == "failed" and rec.error == "no handler for kind known"


def test_non_job_messages_are_left_alone(env: JobEnv) -> None:
    message = Message(queue_name="default", actor_name="plain", args=(), kwargs={}, options={})
    env.mw.before_process_message(env.broker, message)  # no claim, no exception


def test_outputs_are_per_attempt_and_removed_when_an_attempt_fails(env: JobEnv) -> None:
    paths: list[Path] = []

    def produce(ctx: JobContext) -> dict[str, str]:
        path = ctx.output_path("out.txt")
        path.write_text(f"attempt {ctx.attempt}")
        paths.append(path)
        if ctx.attempt == 1:
            raise RuntimeError("fail after writing")
        return {"file": str(path)}

    env.declare("produce", produce, backoff=lambda a: 0)
    job = env.submit("produce")
    _run(env, job.id)
    _run(env, job.id)
    assert paths[0].name == "1-out.txt" and paths[1].name == "2-out.txt"
    assert paths[0].parent.name == job.id
    assert not paths[0].exists() and paths[1].read_text() == "attempt 2"
    assert jobs.get_job(env.engine, job.id, owner_id="u1").result == {"file": str(paths[1])}


def test_result_may_not_reference_a_declared_output_that_was_not_written(env: JobEnv) -> None:
    def liar(ctx: JobContext) -> None:
        path = ctx.output_path("never.txt")
        with ctx.result_transaction() as tx:
            tx.complete({"file": str(path)})

    env.declare("liar", liar, never_retry=(FileNotFoundError,))
    job = env.submit("liar")
    _run(env, job.id)
    rec = jobs.get_job(env.engine, job.id, owner_id="u1")
    assert rec.status == "failed" and "never.txt" in (rec.error or "")


def test_cancel_requested_is_honoured_at_checkpoint(env: JobEnv) -> None:
    entered, release = threading.Event(), threading.Event()

    def waits(ctx: JobContext) -> None:
        entered.set()
        release.wait(10)
        ctx.check_cancelled()

    env.declare("waits", waits)
    job = env.submit("waits")
    ctx = env.claim(job.id)
    assert ctx is not None
    t = threading.Thread(target=env.mw.runner, args=(ctx,))
    t.start()
    entered.wait(10)
    result = jobs.cancel(env.engine, job.id, by="u1")
    assert result.outcome == jobs.CancelOutcome.REQUESTED and result.job.cancel_requested
    release.set()
    t.join(10)
    rec = jobs.get_job(env.engine, job.id, owner_id="u1")
    assert rec.status == "cancelled" and rec.result is None


def test_return_after_cancel_request_ends_cancelled_not_succeeded(env: JobEnv) -> None:
    env.declare("quick", lambda ctx: "done")
    job = env.submit("quick")
    ctx = env.claim(job.id)
    assert ctx is not None
    jobs.cancel(env.engine, job.id, by="u1")
    env.mw.runner(ctx)
    rec = jobs.get_job(env.engine, job.id, owner_id="u1")
    assert rec.status == "cancelled" and rec.result is None


def test_job_cancelled_raised_by_actor(env: JobEnv) -> None:
    def gives_up(ctx: JobContext) -> None:
        raise JobCancelled()

    env.declare("gives_up", gives_up)
    job = env.submit("gives_up")
    _run(env, job.id)
    assert env.row(job.id).status == "cancelled"


def test_stale_attempt_from_actor_writes_nothing(env: JobEnv) -> None:
    def stale(ctx: JobContext) -> None:
        raise StaleAttempt()

    env.declare("stale", stale)
    job = env.submit("stale")
    _run(env, job.id)
    assert env.row(job.id).status == "running"  # left for recovery, nothing written


def test_thread_stuck_past_its_timeout_is_failed_in_the_database(tmp_path: Path) -> None:
    from .support import job_env

    with job_env("sqlite", tmp_path, job_lease_ttl_s=0.6) as env:
        release = threading.Event()

        def stuck(ctx: JobContext) -> str:
            release.wait(20)  # blocked in C: the asynchronous interrupt waits until this returns
            return "too late"

        env.declare("stuck", stuck)
        job = env.submit("stuck", timeout_s=1)
        ctx = env.claim(job.id)
        assert ctx is not None
        env.mw.start_keeper(env.broker)
        runner = threading.Thread(target=env.mw.runner, args=(ctx,))
        runner.start()
        try:
            deadline = time.monotonic() + 10
            while env.row(job.id).status != "failed":
                assert time.monotonic() < deadline, "the stuck attempt was never failed"
                time.sleep(0.05)
            assert runner.is_alive()  # failed in the database while the thread is still stuck
        finally:
            release.set()
            runner.join(10)
            env.mw.stop()
        rec = jobs.get_job(env.engine, job.id, owner_id="u1")
        assert rec.status == "failed" and rec.error == "Job timed out." and rec.result is None


def test_progress_inside_result_transaction_fails_fast(env: JobEnv) -> None:
    def confused(ctx: JobContext) -> None:
        with ctx.result_transaction() as tx:
            ctx.progress(0.5)
            tx.complete(1)

    env.declare("confused", confused, never_retry=(RuntimeError,))
    job = env.submit("confused")
    _run(env, job.id)
    rec = jobs.get_job(env.engine, job.id, owner_id="u1")
    assert rec.status == "failed" and "inside result_transaction" in (rec.error or "")
