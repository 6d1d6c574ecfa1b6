"""``run_now``: a queued job's retry backoff is cleared and its message is due at once (SQLite: the same
row, in the same transaction; other brokers: a fresh message through the outbox)."""

from __future__ import annotations

import json
import time

import jobs
from jobs import JobContext
from jobs.outbox import relay_once
from jobs.publish import JOB_ID_OPTION

from .support import JobEnv

HOUR_S = 3600.0


def _failed_once(env: JobEnv) -> jobs.JobRecord:
    """A job whose first attempt failed and that now waits out a one-hour backoff."""

    def flaky(ctx: JobContext) -> str:
        if ctx.attempt == 1:
            raise RuntimeError("output root is degraded")
        return "ok"

    env.declare("flaky", flaky, backoff=lambda attempt: HOUR_S)
    job = env.submit("flaky")
    ctx = env.claim(job.id)
    assert ctx is not None
    env.mw.runner(ctx)
    row = env.row(job.id)
    assert row.status == "queued" and row.run_after > time.time() * 1000 + HOUR_S * 900
    # The first delivery is gone (the test claimed without consuming it): only the retry's remains.
    if env.backend == "sqlite":
        env.sql("DELETE FROM broker_messages WHERE state = 0")
    else:
        assert relay_once(env.engine, env.broker) == 2
        env.broker.flush_all()
    return job


def _messages(env: JobEnv, job_id: str) -> list[tuple[int, int]]:
    """(state, eta) of the job's broker messages (SQLite on the job file)."""
    rows = env.sql("SELECT state, eta, body FROM broker_messages ORDER BY id")
    return [(r[0], r[1]) for r in rows if json.loads(r[2])["options"].get(JOB_ID_OPTION) == job_id]


def test_run_now_makes_the_delayed_message_due_and_the_next_attempt_runs(env: JobEnv) -> None:
    job = _failed_once(env)
    if env.backend == "sqlite":
        assert [state for state, _ in _messages(env, job.id)] == [3]  # DELAYED
    before = time.time() * 1000

    assert jobs.run_now(env.engine, [job.id, job.id], by="write-gate") == [job.id]

    row = env.row(job.id)
    assert row.status == "queued" and row.run_after <= time.time() * 1000
    [event] = [e for e in jobs.job_events(env.engine, job.id, owner_id="u1") if e.type == "run_now"]
    assert event.data == {"by": "write-gate"}
    if env.backend == "sqlite":
        # the same row, now READY and due: no second message
        [(state, eta)] = _messages(env, job.id)
        assert state == 0 and before - 1000 <= eta <= time.time() * 1000
        consumer = env.broker.consume("default", prefetch=1, timeout=2000)
        message = next(consumer)
        assert message is not None and message.options[JOB_ID_OPTION] == job.id
        consumer.ack(message)
        consumer.close()
    else:
        # a fresh message through the outbox, due now; the relay publishes it
        [(eta,)] = env.sql("SELECT eta FROM outbox WHERE published_at IS NULL AND job_id = :j", j=job.id)
        assert eta <= time.time() * 1000
        assert relay_once(env.engine, env.broker) == 1
    ctx = env.claim(job.id)
    assert ctx is not None and ctx.attempt == 2
    env.mw.runner(ctx)
    assert jobs.get_job(env.engine, job.id, owner_id="u1").status == "succeeded"


def test_run_now_leaves_jobs_that_are_not_waiting_alone(env: JobEnv) -> None:
    env.declare("echo", lambda ctx: "ok")
    due = env.submit("echo")  # queued, due already
    running = env.submit("echo")
    ctx = env.claim(running.id)
    assert ctx is not None
    done = env.submit("echo")
    done_ctx = env.claim(done.id)
    assert done_ctx is not None
    env.mw.runner(done_ctx)
    before = {j: env.row(j).event_seq for j in (due.id, running.id, done.id)}

    assert jobs.run_now(env.engine, [due.id, running.id, done.id, "0" * 32]) == []
    assert jobs.run_now(env.engine, []) == []

    assert {j: env.row(j).event_seq for j in before} == before
    if env.backend == "sqlite":
        assert len(_messages(env, due.id)) == 1  # no duplicate for a job that was due anyway


def test_run_now_publishes_a_fresh_message_when_the_delayed_one_is_gone(sqlite_env: JobEnv) -> None:
    env = sqlite_env
    job = _failed_once(env)
    env.sql("DELETE FROM broker_messages")  # e.g. flushed by an operator
    assert jobs.run_now(env.engine, [job.id]) == [job.id]
    [(state, _)] = _messages(env, job.id)
    assert state == 0
