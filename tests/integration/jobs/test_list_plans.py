"""The job list's SQL uses an index for its order (SQLite has no statistics; a plan change here is a
full scan and sort of the jobs table per page: a 20,000-job bulk count took ~3 s before revision 0008).

The first page walks the index from its newest end; a later page must start at its cursor. The
statements are the ones ``jobs.list_jobs`` really executes, captured from the engine and explained
with their own parameters."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

import jobs
from jobs.queries import JobFilter

from .support import JobEnv


def _plans_of_list(env: JobEnv, **filters: Any) -> list[str]:
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if "FROM jobs" in statement and "ORDER BY created_at DESC" in statement:
            seen.append((statement, parameters))

    status = filters.pop("status", None)
    where = JobFilter(statuses=(status,) if status else ())
    event.listen(env.engine, "before_cursor_execute", capture)
    try:
        first = jobs.list_jobs(env.engine, limit=2, where=where, **filters)
        jobs.list_jobs(env.engine, limit=2, before=first[-1], where=where, **filters)  # a later page (keyset cursor)
    finally:
        event.remove(env.engine, "before_cursor_execute", capture)
    assert len(seen) == 2
    plans = []
    raw = env.engine.raw_connection()
    try:
        for statement, parameters in seen:
            rows = raw.cursor().execute("EXPLAIN QUERY PLAN " + statement, parameters).fetchall()
            plans.append(" | ".join(str(r[-1]) for r in rows))
    finally:
        raw.close()
    return plans


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({"owner_id": "", "is_admin": True}, "ix_jobs_created"),
        ({"owner_id": "", "is_admin": True, "status": "failed"}, "ix_jobs_finished_created"),
        ({"owner_id": "u1"}, "ix_jobs_owner_created"),
        ({"owner_id": "u1", "status": "failed"}, "ix_jobs_owner_created"),
    ],
)
def test_job_lists_walk_an_index_in_order(sqlite_env: JobEnv, filters: dict[str, Any], index: str) -> None:
    env = sqlite_env
    env.declare("noop", lambda ctx: None)
    for owner in ("u1", "u2"):
        for _ in range(5):
            env.submit("noop", owner_id=owner)
    env.sql("UPDATE jobs SET status = 'failed', completed_at = created_at + 1, error = 'x'")
    first, later = _plans_of_list(env, **filters)
    for plan in (first, later):
        assert f"USING INDEX {index}" in plan or f"USING COVERING INDEX {index}" in plan, plan
        assert "USE TEMP B-TREE FOR ORDER BY" not in plan, plan  # "RIGHT PART OF ORDER BY" (the id tie) is fine
    # A later page starts at its cursor (an index range), not by walking from the newest job.
    assert later.startswith(f"SEARCH jobs USING INDEX {index} (") and "<" in later, later


def test_live_statuses_are_found_by_status_and_sorted(sqlite_env: JobEnv) -> None:
    # Queued and running jobs are few (bounded by the workers and the backlog): the status index finds
    # them and a sort orders them; no index of their own, so claims write nothing more.
    env = sqlite_env
    env.declare("noop", lambda ctx: None)
    for _ in range(5):
        env.submit("noop", owner_id="u1")
    for plan in _plans_of_list(env, owner_id="", is_admin=True, status="queued"):
        assert "USING INDEX ix_jobs_status_kind (status=?)" in plan and "SCAN jobs" not in plan, plan
