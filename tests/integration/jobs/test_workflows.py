"""Workflows: fan-out, fan-in, fail-fast, cancel, retry from the failed steps, concurrent fan-in."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest

import jobs
from jobs import CancelOutcome, JobContext
from jobs.execution.completer import Cancelled
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
    env.mw.runner(ctx)


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
    env.mw.runner(c_ctx)  # c returns, but its cancel request wins
    assert env.row(steps["c"].id).status == "cancelled"
    # retry: a new parent re-runs b, c, d and reuses a
    (env.tmp_path / "fail").unlink()
    again = jobs.retry(env.engine, parent.id, by="u1", registry=env.registry, settings=env.settings)
    assert again.retry_of_job_id == parent.id and again.status == "running" and again.created
    # asking again answers the same new parent: no second copy of the steps
    twice = jobs.retry(env.engine, parent.id, by="u1", registry=env.registry, settings=env.settings)
    assert twice.id == again.id and not twice.created
    assert env.sql("SELECT count(*) FROM jobs WHERE retry_of_job_id = :p", p=parent.id)[0][0] == 1
    new_steps = _steps(env, again.id)
    assert sorted(new_steps) == ["b", "c", "d"]
    assert [_messages_for(env, new_steps[n].id) for n in "bcd"] == [1, 1, 0]
    # its progress counts the reused step a as done: 1 of 4 at once, 2 of 4 after b
    assert jobs.get_job(env.engine, again.id, owner_id="u1").progress == 0.25
    _run_step(env, new_steps["b"].id)
    assert jobs.get_job(env.engine, again.id, owner_id="u1").progress == 0.5
    for n in "cd":
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
    env.mw.runner.record(a_ctx, Cancelled())
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
        threads = [threading.Thread(target=env.mw.runner, args=(ctx,)) for ctx in contexts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert _messages_for(env, steps["d"].id) == 1


def _declare_planner(env: JobEnv) -> list[str]:
    """``plan``: a step that adds ``n`` workers after itself and a ``join`` after them, as it completes.

    Returns the list the workflow ids it extended are appended to.
    """
    _declare(env)
    parents: list[str] = []

    def plan(ctx: JobContext, n: int) -> int:
        with ctx.result_transaction() as tx:
            workers = [Step(f"w{i}", "maybe_fail", {"v": i}, depends_on=["plan"]) for i in range(n)]
            join = Step("join", "ok", {"v": 99}, depends_on=[w.name for w in workers], config={"note": "fan-in"})
            extension = jobs.extend_workflow(tx, ctx.job_id, [*workers, join], registry=env.registry)
            assert set(extension.step_ids) == {"plan", "join", *(w.name for w in workers)}
            parents.append(extension.parent_id)
            if (env.tmp_path / "break-plan").exists():
                raise RuntimeError("planner broke after extending")  # rolls the extension back
            tx.complete(n)
        return n

    env.declare("plan", plan, max_attempts=1)
    return parents


def test_a_step_extends_its_workflow_as_it_completes(env: JobEnv) -> None:
    parents = _declare_planner(env)
    parent = submit_workflow(env.engine, owner_id="u1", name="planned", steps=[Step("plan", "plan", {"n": 3})],
                             registry=env.registry, settings=env.settings)  # fmt: skip
    _run_step(env, _steps(env, parent.id)["plan"].id)

    # The new steps exist, wired after the planner; those waiting only for it got their message in its commit
    steps = _steps(env, parent.id)
    assert parents == [parent.id]
    assert sorted(steps) == ["join", "plan", "w0", "w1", "w2"]
    assert [_messages_for(env, steps[n].id) for n in ("w0", "w1", "w2", "join")] == [1, 1, 1, 0]
    graph = jobs.workflow_graph(env.engine, parent.id, owner_id="u1")
    assert graph["w1"].depends_on == ("plan",) and graph["join"].depends_on == ("w0", "w1", "w2")
    assert all(s.job.parent_job_id == parent.id and not s.reused for s in graph.values())
    assert json.loads(env.row(steps["join"].id).config)["note"] == "fan-in"
    described = json.loads(env.row(parent.id).payload)["steps"]
    assert [s["name"] for s in described] == ["plan", "w0", "w1", "w2", "join"]
    extended = [e for e in jobs.job_events(env.engine, parent.id, owner_id="u1") if e.type == "workflow_extended"]
    assert [e.data for e in extended] == [{"by": "plan", "steps": ["w0", "w1", "w2", "join"]}]
    # progress is the mean of the steps': 1 of 5 finished
    assert jobs.get_job(env.engine, parent.id, owner_id="u1").progress == 0.2

    for name in ("w0", "w1", "w2"):
        _run_step(env, steps[name].id)
    assert _messages_for(env, steps["join"].id) == 1  # fan-in over the added steps
    _run_step(env, steps["join"].id)
    done = jobs.get_job(env.engine, parent.id, owner_id="u1")
    assert done.status == "succeeded" and done.result == {"steps": {n: s.id for n, s in steps.items()}}


def test_an_extension_commits_only_with_its_step(env: JobEnv) -> None:
    _declare_planner(env)
    (env.tmp_path / "break-plan").touch()
    parent = submit_workflow(env.engine, owner_id="u1", name="planned", steps=[Step("plan", "plan", {"n": 2})],
                             registry=env.registry, settings=env.settings)  # fmt: skip
    _run_step(env, _steps(env, parent.id)["plan"].id)
    assert sorted(_steps(env, parent.id)) == ["plan"]  # nothing was added
    assert json.loads(env.row(parent.id).payload)["steps"][0]["name"] == "plan"
    failed = jobs.get_job(env.engine, parent.id, owner_id="u1")
    assert failed.status == "failed" and "step plan failed" in (failed.error or "")

    # The retry re-runs the planner, whose extension now commits: the whole DAG runs
    (env.tmp_path / "break-plan").unlink()
    again = jobs.retry(env.engine, parent.id, by="u1", registry=env.registry, settings=env.settings)
    _run_step(env, _steps(env, again.id)["plan"].id)
    steps = _steps(env, again.id)
    for name in ("w0", "w1", "join"):
        _run_step(env, steps[name].id)
    assert jobs.get_job(env.engine, again.id, owner_id="u1").status == "succeeded"


def test_retry_after_an_extension_reruns_only_the_added_steps_that_failed(env: JobEnv) -> None:
    _declare_planner(env)
    parent = submit_workflow(env.engine, owner_id="u1", name="planned", steps=[Step("plan", "plan", {"n": 2})],
                             registry=env.registry, settings=env.settings)  # fmt: skip
    _run_step(env, _steps(env, parent.id)["plan"].id)
    steps = _steps(env, parent.id)
    _run_step(env, steps["w0"].id)
    (env.tmp_path / "fail").touch()
    _run_step(env, steps["w1"].id)  # fails fast: join is cancelled
    assert jobs.get_job(env.engine, parent.id, owner_id="u1").status == "failed"
    assert env.row(steps["join"].id).status == "cancelled"

    (env.tmp_path / "fail").unlink()
    again = jobs.retry(env.engine, parent.id, by="u1", registry=env.registry, settings=env.settings)
    new_steps = _steps(env, again.id)
    assert sorted(new_steps) == ["join", "w1"]  # the planner is not re-run, so it adds nothing twice
    assert [_messages_for(env, new_steps[n].id) for n in ("w1", "join")] == [1, 0]
    graph = jobs.workflow_graph(env.engine, again.id, owner_id="u1")
    assert {n for n, s in graph.items() if s.reused} == {"plan", "w0"}
    assert graph["w0"].depends_on == ("plan",) and graph["join"].depends_on == ("w0", "w1")
    assert json.loads(env.row(new_steps["join"].id).config)["note"] == "fan-in"  # the step's config survives
    _run_step(env, new_steps["w1"].id)
    _run_step(env, new_steps["join"].id)
    done = jobs.get_job(env.engine, again.id, owner_id="u1")
    assert done.status == "succeeded"
    assert done.result == {"steps": {"plan": steps["plan"].id, "w0": steps["w0"].id,
                                     "w1": new_steps["w1"].id, "join": new_steps["join"].id}}  # fmt: skip


def test_extending_is_refused_outside_a_running_workflow(env: JobEnv) -> None:
    _declare(env)
    seen: list[BaseException] = []

    def adds(name: str) -> Callable[[JobContext], None]:
        """A kind that tries to add a step called *name* as it completes, and completes either way."""

        def fn(ctx: JobContext) -> None:
            with ctx.result_transaction() as tx:
                try:
                    jobs.extend_workflow(tx, ctx.job_id, [Step(name, "ok", {"v": 1})], registry=env.registry)
                except ValueError as exc:
                    seen.append(exc)
                tx.complete(None)

        return fn

    env.declare("lone", adds("x"))
    env.declare("rename", adds("a"))
    job = env.submit("lone")
    _run_step(env, job.id)
    parent = submit_workflow(env.engine, owner_id="u1", name="wf", steps=[Step("a", "rename")],
                             registry=env.registry, settings=env.settings)  # fmt: skip
    _run_step(env, _steps(env, parent.id)["a"].id)
    assert [str(e) for e in seen] == [
        f"job {job.id} is not a step of a workflow",
        "the workflow already has steps named a",
    ]
    assert jobs.get_job(env.engine, parent.id, owner_id="u1").status == "succeeded"


def test_a_workflow_kind_is_submitted_like_any_kind(env: JobEnv) -> None:
    _declare_planner(env)

    @env.registry.workflow("planned_kind")
    def planned_kind(request: jobs.WorkflowRequest, *, n: int = 2) -> list[Step]:
        """A planner and what it plans."""
        assert request.owner_id == "u1" and request.kind == "planned_kind"
        return [Step("plan", "plan", {"n": n})]

    first = env.submit("planned_kind", payload={"n": 1}, idempotency_key="k1")
    assert first.created and first.kind == "planned_kind" and first.status == "running"
    again = env.submit("planned_kind", payload={"n": 1}, idempotency_key="k1")
    assert again.id == first.id and not again.created
    with pytest.raises(jobs.IdempotencyConflict):
        env.submit("planned_kind", payload={"n": 5}, idempotency_key="k1")
    with pytest.raises(ValueError, match="does not fit"):
        env.submit("planned_kind", payload={"nope": 1})
    later = env.submit("planned_kind", payload={}, delay=5)  # a delay holds its first steps (see below)
    held = env.row(_steps(env, later.id)["plan"].id)
    assert later.status == "running" and held.run_after - held.created_at == 5000
    assert json.loads(env.row(first.id).payload)["request"] == {"n": 1}
    _run_step(env, _steps(env, first.id)["plan"].id)
    steps = _steps(env, first.id)
    for name in ("w0", "join"):
        _run_step(env, steps[name].id)
    assert jobs.get_job(env.engine, first.id, owner_id="u1").status == "succeeded"


def test_a_delayed_workflow_holds_its_first_steps(sqlite_env: JobEnv) -> None:
    env = sqlite_env
    _declare(env)
    before = jobs.store.now_ms()
    parent = submit_workflow(env.engine, owner_id="u1", name="later", steps=DIAMOND, registry=env.registry,
                             settings=env.settings, delay=60)  # fmt: skip
    steps = _steps(env, parent.id)
    etas = {
        json.loads(body)["options"]["tenure_job_id"]: eta
        for body, eta in env.sql("SELECT body, eta FROM broker_messages")
    }
    assert list(etas) == [steps["a"].id]  # only the first step has a message, due in a minute
    assert before + 59_000 <= etas[steps["a"].id] <= jobs.store.now_ms() + 60_000
    # The row's run_after and the message's eta are read from the clock a moment apart (the broker stamps its eta).
    assert abs(env.row(steps["a"].id).run_after - etas[steps["a"].id]) <= 50
    assert env.row(steps["b"].id).run_after < before + 59_000  # later steps wait for their dependencies only
    assert env.claim(steps["a"].id) is not None  # an early delivery (run_now) may still run it


def test_the_parent_progress_moves_while_a_step_runs(env: JobEnv) -> None:
    # Given a two-step workflow whose first step reports half its work, then waits
    reported, release = threading.Event(), threading.Event()

    def long_step(ctx: JobContext, v: int) -> int:
        ctx.progress(0.5, "half way")
        assert ctx.flush_progress()
        reported.set()
        assert release.wait(10)
        return v

    env.declare("long", long_step)
    env.declare("ok", lambda ctx, v: v)
    steps = [Step("a", "long", {"v": 1}), Step("b", "ok", {"v": 2}, depends_on=["a"])]
    parent = submit_workflow(env.engine, owner_id="u1", name="two", steps=steps, registry=env.registry,
                             settings=env.settings)  # fmt: skip
    a = _steps(env, parent.id)["a"]
    ctx = env.claim(a.id)
    assert ctx is not None
    runner = threading.Thread(target=env.mw.runner, args=(ctx,))
    runner.start()
    try:
        # When the step has written its progress, still running
        assert reported.wait(10)
        # Then the workflow's progress is already the mean of its steps' (0.5 and 0), not 0
        assert jobs.get_job(env.engine, a.id, owner_id="u1").status == "running"
        assert jobs.get_job(env.engine, parent.id, owner_id="u1").progress == 0.25
    finally:
        release.set()
        runner.join(10)
    assert jobs.get_job(env.engine, parent.id, owner_id="u1").progress == 0.5  # a finished: 1 of 2
