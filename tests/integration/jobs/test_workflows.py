"""Workflows: fan-out, fan-in, fail-fast, cancel, retry from the failed steps, concurrent fan-in."""

from __future__ import annotations

import json
import threading

import pytest

import jobs
from jobs import CancelOutcome, JobContext
from jobs.middleware import run_job
from jobs.workflows import Step, retry_workflow, submit_workflow, workflow_steps

from .support import JobEnv


def _messages_for(env: JobEnv, job_id: str) -> int:
    if env.backend == "sqlite":
        bodies = [r[0] for r in env.sql("SELECT body FROM broker_messages")]
        return sum(json.loads(b)["options"].get("tenure_job_id") == job_id for b in bodies)
    return env.sql("SELECT count(*) FROM outbox WHERE job_id = :j", j=job_id)[0][0]


def _steps(env: JobEnv, parent_id: str) -> dict[str, jobs.JobRecord]:
    return {
        json.loads(env.row(s.id).config)["workflow_step"]: s
        for s in workflow_steps(env.engine, parent_id, owner_id="u1")
    }


def _run_step(env: JobEnv, job_id: str) -> None:
    ctx = env.claim(job_id)
    assert ctx is not None
    run_job(env.mw, ctx)


DIAMOND = [
    Step("a", "ok", {"v": 1}),
    Step("b", "ok", {"v": 2}, depends_on=["a"]),
    Step("c", "ok", {"v": 3}, depends_on=["a"]),
    Step("d", "ok", {"v": 4}, depends_on=["b", "c"]),
]


def _declare(env: JobEnv) -> None:
    env.declare("ok", lambda ctx, v: v)

    def maybe_fail(ctx: JobContext, v: int) -> int:
        if (env.tmp_path / "fail").exists():
            raise ValueError(f"step value {v} rejected")
        return v

    env.declare("maybe_fail", maybe_fail, never_retry=(ValueError,))


def test_fan_out_fan_in(env: JobEnv) -> None:
    _declare(env)
    parent = submit_workflow(env.engine, owner_id="u1", name="diamond", steps=DIAMOND, registry=env.registry,
                             settings=env.settings)  # fmt: skip
    assert parent.status == "running" and parent.created
    steps = _steps(env, parent.id)
    assert [_messages_for(env, steps[n].id) for n in "abcd"] == [1, 0, 0, 0]
    _run_step(env, steps["a"].id)
    assert [_messages_for(env, steps[n].id) for n in "bcd"] == [1, 1, 0]  # fan-out, same transaction
    _run_step(env, steps["b"].id)
    assert _messages_for(env, steps["d"].id) == 0
    assert jobs.get_job(env.engine, parent.id, owner_id="u1").progress == 0.5
    _run_step(env, steps["c"].id)
    assert _messages_for(env, steps["d"].id) == 1  # fan-in
    _run_step(env, steps["d"].id)
    done = jobs.get_job(env.engine, parent.id, owner_id="u1")
    assert done.status == "succeeded" and done.progress == 1.0
    assert done.result == {"steps": {n: steps[n].id for n in "abcd"}}


def test_invalid_dags_are_refused(env: JobEnv) -> None:
    _declare(env)
    for steps, message in [
        ([Step("a", "ok", depends_on=["b"]), Step("b", "ok", depends_on=["a"])], "cycle"),
        ([Step("a", "ok", depends_on=["zzz"])], "unknown step"),
        ([Step("a", "ok"), Step("a", "ok")], "unique"),
        ([], "at least one"),
    ]:
        with pytest.raises(ValueError, match=message):
            submit_workflow(env.engine, owner_id="u1", name="bad", steps=steps, registry=env.registry,
                            settings=env.settings)  # fmt: skip
    assert env.sql("SELECT count(*) FROM jobs")[0][0] == 0


def test_fail_fast_then_retry_from_failed_steps(env: JobEnv) -> None:
    _declare(env)
    (env.tmp_path / "fail").touch()
    steps_def = [
        Step("a", "ok", {"v": 1}),
        Step("b", "maybe_fail", {"v": 2}, depends_on=["a"]),
        Step("c", "ok", {"v": 3}, depends_on=["a"]),
        Step("d", "ok", {"v": 4}, depends_on=["b", "c"]),
    ]
    parent = submit_workflow(env.engine, owner_id="u1", name="wf", steps=steps_def, registry=env.registry,
                             settings=env.settings)  # fmt: skip
    steps = _steps(env, parent.id)
    _run_step(env, steps["a"].id)
    c_ctx = env.claim(steps["c"].id)  # c is running when b fails
    assert c_ctx is not None
    _run_step(env, steps["b"].id)
    failed = jobs.get_job(env.engine, parent.id, owner_id="u1")
    assert failed.status == "failed" and failed.error is not None and failed.error.startswith("step b failed")
    assert env.row(steps["d"].id).status == "cancelled"
    assert env.row(steps["c"].id).cancel_requested_at is not None
    with pytest.raises(jobs.JobNotRetryable, match="still has running steps"):
        retry_workflow(env.engine, parent.id, by="u1", registry=env.registry, settings=env.settings)
    run_job(env.mw, c_ctx)  # c returns, but its cancel request wins
    assert env.row(steps["c"].id).status == "cancelled"
    # retry: a new parent re-runs b, c, d and reuses a
    (env.tmp_path / "fail").unlink()
    again = jobs.retry(env.engine, parent.id, by="u1", registry=env.registry, settings=env.settings)
    assert again.retry_of_job_id == parent.id and again.status == "running"
    new_steps = _steps(env, again.id)
    assert sorted(new_steps) == ["b", "c", "d"]
    assert [_messages_for(env, new_steps[n].id) for n in "bcd"] == [1, 1, 0]
    for n in "bcd":
        _run_step(env, new_steps[n].id)
    done = jobs.get_job(env.engine, again.id, owner_id="u1")
    assert done.status == "succeeded"
    assert done.result == {"steps": {"a": steps["a"].id, **{n: new_steps[n].id for n in "bcd"}}}


def test_cancel_workflow(env: JobEnv) -> None:
    _declare(env)
    parent = submit_workflow(env.engine, owner_id="u1", name="diamond", steps=DIAMOND, registry=env.registry,
                             settings=env.settings)  # fmt: skip
    steps = _steps(env, parent.id)
    a_ctx = env.claim(steps["a"].id)
    assert a_ctx is not None
    result = jobs.cancel(env.engine, parent.id, by="u1")
    assert result.outcome == CancelOutcome.REQUESTED and result.job.status == "running"
    assert [env.row(steps[n].id).status for n in "bcd"] == ["cancelled"] * 3
    env.mw.finish(a_ctx, a_ctx._kind, "cancelled")  # type: ignore[attr-defined]
    assert jobs.get_job(env.engine, parent.id, owner_id="u1").status == "cancelled"


def test_steps_finishing_together_release_their_dependent_once(env: JobEnv) -> None:
    barrier = threading.Barrier(2)

    def together(ctx: JobContext, v: int) -> int:
        barrier.wait(10)
        return v

    env.declare("ok", lambda ctx, v: v)
    env.declare("together", together)
    for _ in range(10):
        steps_def = [
            Step("b", "together", {"v": 1}),
            Step("c", "together", {"v": 2}),
            Step("d", "ok", {"v": 3}, depends_on=["b", "c"]),
        ]
        parent = submit_workflow(env.engine, owner_id="u1", name="join", steps=steps_def, registry=env.registry,
                                 settings=env.settings)  # fmt: skip
        steps = _steps(env, parent.id)
        contexts = [env.claim(steps[n].id) for n in "bc"]
        threads = [threading.Thread(target=run_job, args=(env.mw, ctx)) for ctx in contexts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert _messages_for(env, steps["d"].id) == 1
