"""Deleting a finished job on both engines: its events, edges, search rows and a workflow's steps go in one
transaction; what may not go yet is refused with the reason."""

from __future__ import annotations

import pytest

import jobs
from jobs import JobNotDeletable, JobNotFound
from jobs.queries import JobFilter
from jobs.workflows import Step, submit_workflow

from .support import JobEnv


def _run(env: JobEnv, job_id: str) -> None:
    ctx = env.claim(job_id)
    assert ctx is not None
    env.mw.runner(ctx)


def _count(env: JobEnv, sql: str, ids: list[str]) -> int:
    return sum(env.sql(sql, j=i)[0][0] for i in ids)


def test_a_finished_workflow_goes_with_its_steps_and_every_row(env: JobEnv) -> None:
    env.declare("ok", lambda ctx, v: v, summary=lambda p: f"needle-{p['v']}")
    steps = [Step("a", "ok", {"v": 1}), Step("b", "ok", {"v": 2}, depends_on=["a"])]
    parent = submit_workflow(
        env.engine, owner_id="u1", name="pair", steps=steps, registry=env.registry, settings=env.settings
    )
    a, b = (s.id for s in jobs.workflow_steps(env.engine, parent.id, owner_id="u1"))
    with pytest.raises(JobNotDeletable, match="running"):
        jobs.delete_job(env.engine, parent.id, by="u1")
    _run(env, a)
    _run(env, b)
    other = env.submit("ok", payload={"v": 3})  # the live feed's newest entry is another job's
    with pytest.raises(JobNotDeletable, match="step of workflow"):
        jobs.delete_job(env.engine, a, by="u1")
    with pytest.raises(JobNotFound):
        jobs.delete_job(env.engine, parent.id, by="someone-else")

    deleted = jobs.delete_job(env.engine, parent.id, by="u1")

    ids = [parent.id, a, b]
    assert deleted.job_ids[0] == parent.id and set(deleted.job_ids) == set(ids) and deleted.events > 0
    assert _count(env, "SELECT count(*) FROM jobs WHERE id = :j", ids) == 0
    assert _count(env, "SELECT count(*) FROM job_events WHERE job_id = :j", ids) == 0
    assert _count(env, "SELECT count(*) FROM job_dependencies WHERE job_id = :j OR depends_on_job_id = :j", ids) == 0
    # the text search no longer finds them (FTS5 / pg_trgm rows went with them); the other job stays
    found = jobs.list_jobs(env.engine, owner_id="u1", where=JobFilter(search="needle"))
    assert [j.id for j in found] == [other.id]


def test_a_job_its_retry_refers_to_waits_for_the_retry(env: JobEnv) -> None:
    def fail(ctx: jobs.JobContext) -> None:
        raise ValueError("no")

    env.declare("bad", fail, never_retry=(ValueError,))
    first = env.submit("bad", payload={})
    _run(env, first.id)
    retry = jobs.retry(env.engine, first.id, by="u1", registry=env.registry, settings=env.settings)
    jobs.cancel(env.engine, retry.id, by="u1")
    env.submit("bad", payload={})
    with pytest.raises(JobNotDeletable, match=retry.id):
        jobs.delete_job(env.engine, first.id, by="u1")
    jobs.delete_job(env.engine, retry.id, by="u1")
    assert jobs.delete_job(env.engine, first.id, by="u1", is_admin=True).job_ids == (first.id,)
