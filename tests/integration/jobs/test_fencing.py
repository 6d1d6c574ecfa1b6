"""Fencing: once a job's lease was taken over (aged with SQL, then re-claimed), the old attempt's
progress, events, result, failure, retry, cancel and heartbeat change nothing; its broker ack is
fenced too. Plus the result_transaction's atomicity."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import text

import jobs
from jobs import JobContext, StaleAttempt
from jobs.execution.completer import TIMED_OUT, Cancelled, Failed, Succeeded
from jobs.execution.runner import failure

from .support import JobEnv


def _taken_over(env: JobEnv) -> tuple[str, JobContext, JobContext]:
    env.declare("safe", lambda ctx: "new attempt's result")
    job = env.submit("safe")
    old = env.claim(job.id)
    assert old is not None and old.attempt == 1
    env.age_lease(job.id)
    new = env.claim(job.id, env.worker())
    assert new is not None and new.attempt == 2
    return job.id, old, new


def _domain_table(env: JobEnv) -> None:
    env.sql("CREATE TABLE domain_rows (job_id VARCHAR(32), note VARCHAR(100))")


def _result_transaction(ctx: JobContext) -> None:
    with ctx.result_transaction() as tx:
        tx.connection.execute(text("INSERT INTO domain_rows VALUES (:j, 'stale')"), {"j": ctx.job_id})
        tx.complete({"stale": True})


WRITES: dict[str, Callable[[JobContext], object]] = {
    "progress": lambda ctx: ctx.progress(0.9, "stale"),
    "event": lambda ctx: ctx.event("stale", x=1),
    "check_cancelled": lambda ctx: ctx.check_cancelled(),
    "result_transaction": _result_transaction,
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_stale_context_writes_are_refused(env: JobEnv, write: str) -> None:
    _domain_table(env)
    job_id, old, new = _taken_over(env)
    before = env.row(job_id)
    with pytest.raises(StaleAttempt):
        WRITES[write](old)
    after = env.row(job_id)
    assert after == before
    assert env.sql("SELECT count(*) FROM domain_rows")[0][0] == 0
    assert old.lost


@pytest.mark.parametrize("outcome", ["ok", "error", "cancelled", "timeout"])
def test_stale_outcomes_are_refused(env: JobEnv, outcome: str) -> None:
    job_id, old, new = _taken_over(env)
    before = env.row(job_id)
    outcomes = {
        "ok": lambda: Succeeded('"stale result"'),
        "error": lambda: failure(old, old._kind, RuntimeError("stale failure")),  # type: ignore[attr-defined]
        "cancelled": Cancelled,
        "timeout": lambda: Failed(TIMED_OUT),
    }
    env.mw.runner.record(old, outcomes[outcome]())
    assert env.row(job_id) == before
    env.extra_middleware[0].runner(new)  # the current attempt still completes
    rec = jobs.get_job(env.engine, job_id, owner_id="u1")
    assert rec.status == "succeeded" and rec.attempt == 2 and rec.result == "new attempt's result"


def test_stale_heartbeat_is_refused_and_marks_the_context_lost(env: JobEnv) -> None:
    job_id, old, new = _taken_over(env)
    expires = env.row(job_id).lease_expires_at
    env.mw.worker.track(old)
    env.mw.keeper.renew_leases()
    assert old.lost and env.row(job_id).lease_expires_at == expires


def test_stale_actor_run_writes_nothing(env: JobEnv) -> None:
    job_id, old, new = _taken_over(env)
    before = env.row(job_id)
    env.mw.runner(old)  # the old execution finishing late: its success is fenced
    assert env.row(job_id) == before


def test_broker_ack_of_a_reclaimed_message_is_fenced(sqlite_env: JobEnv) -> None:
    from broker import SQLiteBroker

    env = sqlite_env
    env.declare("safe", lambda ctx: None)
    env.submit("safe")
    first = env.broker.consume("default", prefetch=1, timeout=1000)
    message = next(first)
    assert message is not None
    env.sql("UPDATE broker_messages SET lease_expires = 1")
    other = SQLiteBroker(env.url, middleware=[])
    other.declare_queue("default")
    try:
        assert other.reap() == 1
        second = other.consume("default", prefetch=1, timeout=1000)
        again = next(second)
        assert again is not None and again._deliveries == 2
        first.ack(message)  # the stale ack
        env.broker._acks.flush(5)  # type: ignore[union-attr]
        assert env.broker.leases_lost == 1
        assert env.sql("SELECT count(*) FROM broker_messages")[0][0] == 1  # still there for the new owner
        second.ack(again)
        other._acks.flush(5)  # type: ignore[union-attr]
        assert env.sql("SELECT count(*) FROM broker_messages")[0][0] == 0
        second.close()
    finally:
        first.close()
        other.close()


# -- result_transaction atomicity --------------------------------------------------------------------
def test_exception_inside_result_transaction_rolls_everything_back(env: JobEnv) -> None:
    _domain_table(env)

    def boom(ctx: JobContext) -> None:
        with ctx.result_transaction() as tx:
            tx.connection.execute(text("INSERT INTO domain_rows VALUES (:j, 'x')"), {"j": ctx.job_id})
            tx.complete("never")
            raise RuntimeError("after complete")

    env.declare("boom", boom)
    job = env.submit("boom")
    ctx = env.claim(job.id)
    assert ctx is not None
    with pytest.raises(RuntimeError):
        boom(ctx)
    assert env.sql("SELECT count(*) FROM domain_rows")[0][0] == 0
    assert env.row(job.id).status == "running" and env.row(job.id).result is None


def test_leaving_without_complete_rolls_back(env: JobEnv) -> None:
    _domain_table(env)

    def forgets(ctx: JobContext) -> str:
        with ctx.result_transaction() as tx:
            tx.connection.execute(text("INSERT INTO domain_rows VALUES (:j, 'x')"), {"j": ctx.job_id})
        assert ctx.completed is False
        return "returned"

    env.declare("forgets", forgets)
    job = env.submit("forgets")
    ctx = env.claim(job.id)
    assert ctx is not None
    env.mw.runner(ctx)
    assert env.sql("SELECT count(*) FROM domain_rows")[0][0] == 0
    assert jobs.get_job(env.engine, job.id, owner_id="u1").result == "returned"


def test_complete_commits_domain_rows_and_result_together(env: JobEnv) -> None:
    _domain_table(env)

    def publishes(ctx: JobContext) -> None:
        with ctx.result_transaction() as tx:
            tx.connection.execute(text("INSERT INTO domain_rows VALUES (:j, 'x')"), {"j": ctx.job_id})
            tx.complete({"rows": 1})

    env.declare("publishes", publishes)
    job = env.submit("publishes")
    ctx = env.claim(job.id)
    assert ctx is not None
    env.mw.runner(ctx)
    assert env.sql("SELECT count(*) FROM domain_rows")[0][0] == 1
    rec = jobs.get_job(env.engine, job.id, owner_id="u1")
    assert rec.status == "succeeded" and rec.result == {"rows": 1}
