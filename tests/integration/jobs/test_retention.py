"""Retention (``jobs.retention.prune``) on a real SQLite file and on PostgreSQL: per-status retention,
workflows pruned whole, retried jobs kept while their retry is, events of kept jobs, the live feed's
cursor, bounded batches and two runs at once. Time is moved by passing ``now``, never by sleeping."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from sqlalchemy import event

import jobs
from jobs import JobContext
from jobs.db import make_engine
from jobs.errors import CursorExpired
from jobs.outbox import relay_once
from jobs.queries import changes_after
from jobs.recovery import recover_expired
from jobs.retention import DAY_S, PruneReport, RetentionPolicy, effective_policy, prune
from jobs.workflows import Step, submit_workflow, workflow_steps
from settings import runtime as rs
from settings.environment import Settings

from .support import JobEnv

DAY_MS = 86_400_000
#: Succeeded jobs 1 day, the others 3 days; events 10 days (longer: they go with their jobs).
POLICY = RetentionPolicy(
    jobs_s={"succeeded": DAY_S, "failed": 3 * DAY_S, "cancelled": 3 * DAY_S, "interrupted": 3 * DAY_S},
    events_s=10 * DAY_S,
)


def _declare(env: JobEnv) -> None:
    env.declare("ok", lambda ctx, **_: 1)

    def boom(ctx: JobContext, **_: Any) -> None:
        raise ValueError("boom")

    env.declare("boom", boom, never_retry=(ValueError,))
    env.declare("unsafe", lambda ctx: None, safe_to_rerun=False)

    def chatty(ctx: JobContext, n: int = 3, fail: bool = False) -> int:
        for i in range(n):
            ctx.event("step", i=i)
        if fail:
            raise ValueError("chatty failed")
        return n

    env.declare("chatty", chatty, never_retry=(ValueError,))


def _run(env: JobEnv, job_id: str) -> str:
    ctx = env.claim(job_id)
    assert ctx is not None
    env.mw.runner(ctx)
    return env.row(job_id).status


def _ids(env: JobEnv) -> set[str]:
    return {r[0] for r in env.sql("SELECT id FROM jobs")}


def _count(env: JobEnv, sql: str, **params: Any) -> int:
    return int(env.sql(sql, **params)[0][0])


def _latest_completion(env: JobEnv) -> int:
    return _count(env, "SELECT max(completed_at) FROM jobs")


def _age(env: JobEnv, job_ids: list[str], completed_at: int) -> None:
    """Pretend *job_ids* finished at *completed_at* (the rule reads completed_at only)."""
    for job_id in job_ids:
        assert env.sql("UPDATE jobs SET completed_at = :t WHERE id = :id", t=completed_at, id=job_id) == 1


def test_each_status_has_its_own_retention_and_live_jobs_are_never_touched(env: JobEnv) -> None:
    # Given one finished job per terminal status, then a queued and a running job
    _declare(env)
    ok = env.submit("ok", idempotency_key="key-1")
    assert _run(env, ok.id) == "succeeded"
    failed = env.submit("boom")
    assert _run(env, failed.id) == "failed"
    cancelled = env.submit("ok")
    assert jobs.cancel(env.engine, cancelled.id, by="u1").job.status == "cancelled"
    interrupted = env.submit("unsafe")
    assert env.claim(interrupted.id) is not None
    env.age_lease(interrupted.id)
    recover_expired(env.engine, broker=env.broker)
    assert env.row(interrupted.id).status == "interrupted"
    finished_at = _latest_completion(env)
    queued = env.submit("chatty")
    running = env.submit("chatty")
    ctx = env.claim(running.id)
    assert ctx is not None
    ctx.event("working", n=1)
    if env.backend != "sqlite":
        relay_once(env.engine, env.broker)  # every outbox row published
        assert _count(env, "SELECT count(*) FROM outbox WHERE job_id = :j", j=ok.id) == 1
    live_events = _count(env, "SELECT count(*) FROM job_events WHERE job_id IN (:a, :b)", a=queued.id, b=running.id)

    # When two days have passed: only the succeeded job is past its retention
    report = prune(env.engine, POLICY, now=finished_at + 2 * DAY_MS)
    assert report.jobs == 1 and report.events >= 3 and report.complete
    assert _ids(env) == {failed.id, cancelled.id, interrupted.id, queued.id, running.id}
    assert _count(env, "SELECT count(*) FROM job_events WHERE job_id = :j", j=ok.id) == 0
    assert _count(env, "SELECT count(*) FROM idempotency") == 0
    if env.backend != "sqlite":
        # the pruned job's published row went with it; the others, published over a day ago, too
        assert report.outbox == 6 and _count(env, "SELECT count(*) FROM outbox") == 0

    # When four days have passed: every finished job is gone, the live ones are untouched
    report = prune(env.engine, POLICY, now=finished_at + 4 * DAY_MS)
    assert report.jobs == 3
    assert _ids(env) == {queued.id, running.id}
    much_later = prune(env.engine, POLICY, now=finished_at + 1000 * DAY_MS)
    assert much_later == PruneReport()
    assert _ids(env) == {queued.id, running.id}
    assert env.row(running.id).status == "running" and env.row(queued.id).status == "queued"
    assert _count(env, "SELECT count(*) FROM job_events") == live_events


def test_a_workflow_goes_whole_and_only_when_every_step_is_finished_and_due(env: JobEnv) -> None:
    # Given a workflow that failed fast (a succeeded, b failed, c cancelled) ...
    _declare(env)
    steps = [Step("a", "ok"), Step("b", "boom", depends_on=["a"]), Step("c", "ok", depends_on=["a"])]
    parent = submit_workflow(
        env.engine, owner_id="u1", name="wf", steps=steps, registry=env.registry, settings=env.settings
    )
    by_name = {
        json.loads(env.row(s.id).config)["workflow_step"]: s.id
        for s in workflow_steps(env.engine, parent.id, owner_id="u1")
    }
    assert _run(env, by_name["a"]) == "succeeded"
    assert _run(env, by_name["b"]) == "failed"
    assert env.row(parent.id).status == "failed" and env.row(by_name["c"]).status == "cancelled"
    # ... and step b retried by hand inside it: a queued member
    b2 = jobs.retry(env.engine, by_name["b"], by="u1", registry=env.registry, settings=env.settings)
    assert b2.parent_job_id == parent.id and b2.status == "queued"
    unit = {parent.id, *by_name.values(), b2.id}

    # Then however late, nothing of the unit goes while one member is live
    assert prune(env.engine, POLICY, now=_latest_completion(env) + 1000 * DAY_MS).jobs == 0
    assert unit <= _ids(env)

    # When the retried step ends too, the unit waits for its slowest member's retention (the
    # succeeded step a is past its 1 day, the failed parent is not past its 3)
    assert jobs.cancel(env.engine, b2.id, by="u1").job.status == "cancelled"
    done = _latest_completion(env)
    newer = env.submit("ok")  # a newer event elsewhere (SQLite never deletes the newest event row)
    assert prune(env.engine, POLICY, now=done + 2 * DAY_MS).jobs == 0
    assert unit <= _ids(env)
    # Then the whole unit goes at once, dependency edges with it
    report = prune(env.engine, POLICY, now=done + 4 * DAY_MS)
    assert report.jobs == len(unit) == 5
    assert _ids(env) == {newer.id}
    assert _count(env, "SELECT count(*) FROM job_dependencies") == 0


def test_a_job_is_kept_while_a_kept_job_retries_it(env: JobEnv) -> None:
    _declare(env)
    t0 = 1_800_000_000_000
    old = env.submit("boom")
    assert _run(env, old.id) == "failed"
    retry = jobs.retry(env.engine, old.id, by="u1", registry=env.registry, settings=env.settings)
    _age(env, [old.id], t0)
    # While the retry is queued, the old job stays whatever its age
    report = prune(env.engine, POLICY, now=t0 + 100 * DAY_MS)
    assert report.jobs == 0 and report.held == 1
    assert _run(env, retry.id) == "failed"
    _age(env, [retry.id], t0 + 10 * DAY_MS)
    newer = env.submit("ok")  # the newest event is elsewhere
    # The retry is kept (finished 2 days ago), so the job it retries is held, its reference intact
    report = prune(env.engine, POLICY, now=t0 + 12 * DAY_MS)
    assert report.jobs == 0 and report.held == 1
    assert env.row(retry.id).retry_of_job_id == old.id
    # Once the retry is due, both go in the same run
    report = prune(env.engine, POLICY, now=t0 + 14 * DAY_MS)
    assert report.jobs == 2 and report.held == 0
    assert _ids(env) == {newer.id}


def test_a_workflow_whose_steps_a_kept_workflow_reuses_is_kept(env: JobEnv) -> None:
    # Given a failed workflow and its retry, which reuses the succeeded step a (a dependency edge
    # from the new run's step b to the old run's a)
    _declare(env)
    (env.tmp_path / "fail").touch()

    def maybe_fail(ctx: JobContext) -> int:
        if (env.tmp_path / "fail").exists():
            raise ValueError("rejected")
        return 1

    env.declare("maybe_fail", maybe_fail, never_retry=(ValueError,))
    steps = [Step("a", "ok"), Step("b", "maybe_fail", depends_on=["a"])]
    first = submit_workflow(env.engine, owner_id="u1", name="wf", steps=steps, registry=env.registry,
                            settings=env.settings)  # fmt: skip
    first_steps = {
        json.loads(env.row(s.id).config)["workflow_step"]: s.id
        for s in workflow_steps(env.engine, first.id, owner_id="u1")
    }
    _run(env, first_steps["a"])
    _run(env, first_steps["b"])
    assert env.row(first.id).status == "failed"
    (env.tmp_path / "fail").unlink()
    second = jobs.retry(env.engine, first.id, by="u1", registry=env.registry, settings=env.settings)
    for s in workflow_steps(env.engine, second.id, owner_id="u1"):
        _run(env, s.id)
    assert env.row(second.id).status == "succeeded"
    edge = env.sql("SELECT job_id FROM job_dependencies WHERE depends_on_job_id = :a", a=first_steps["a"])
    assert len(edge) == 2  # the first run's b, and the second run's b (on the reused a)
    # Isolate the dependency rule from the retry link, then make the first run old and the second recent
    env.sql("UPDATE jobs SET retry_of_job_id = NULL WHERE id = :id", id=second.id)
    t0 = 1_800_000_000_000
    _age(env, [first.id, *first_steps.values()], t0)
    _age(env, [second.id, *(s.id for s in workflow_steps(env.engine, second.id, owner_id="u1"))], t0 + 10 * DAY_MS)
    newer = env.submit("ok")
    # Then the first run is held: deleting it would silently drop the kept step's dependency edge
    report = prune(env.engine, POLICY, now=t0 + 11 * DAY_MS)
    assert report.jobs == 0 and report.held == 1
    assert sorted(
        env.sql("SELECT job_id FROM job_dependencies WHERE depends_on_job_id = :a", a=first_steps["a"])
    ) == sorted(edge)
    report = prune(env.engine, POLICY, now=t0 + 20 * DAY_MS)
    assert report.jobs == 5 and _ids(env) == {newer.id}


def test_old_events_of_kept_jobs_go_but_each_keeps_its_last(env: JobEnv) -> None:
    # Given a failed job with 6 events (kept 30 days) and events kept 1 day; and a running job
    _declare(env)
    failed = env.submit("chatty", payload={"n": 4, "fail": True})
    assert _run(env, failed.id) == "failed"
    finished_at = env.row(failed.id).completed_at
    assert finished_at is not None
    seq = env.row(failed.id).event_seq
    running = env.submit("chatty")
    ctx = env.claim(running.id)
    assert ctx is not None
    for i in range(3):
        ctx.event("working", i=i)
    running_events = _count(env, "SELECT count(*) FROM job_events WHERE job_id = :j", j=running.id)
    policy = RetentionPolicy(jobs_s={s: 30 * DAY_S for s in POLICY.jobs_s}, events_s=DAY_S)
    # When 2 days have passed
    report = prune(env.engine, policy, now=finished_at + 2 * DAY_MS)
    # Then the failed job is kept with only its last event (how it ended); the running job is untouched
    assert report.jobs == 0 and report.events == seq - 1
    last = env.sql("SELECT sequence, type, data FROM job_events WHERE job_id = :j", j=failed.id)
    assert [(s, t) for s, t, _ in last] == [(seq, "status")] and json.loads(last[0][2])["status"] == "failed"
    assert _count(env, "SELECT count(*) FROM job_events WHERE job_id = :j", j=running.id) == running_events
    assert prune(env.engine, policy, now=finished_at + 3 * DAY_MS).events == 0
    # The job's own event list still reads (after its cursor) and shows the final status
    assert [e.type for e in jobs.job_events(env.engine, failed.id, owner_id="u1")] == ["status"]


def test_the_live_feed_cursor_never_goes_back(sqlite_env: JobEnv) -> None:
    env = sqlite_env
    _declare(env)
    first = env.submit("chatty")
    assert _run(env, first.id) == "succeeded"
    page = changes_after(env.engine, "0", is_admin=True)
    cursor = page.cursor
    early = page.items[1].cursor  # a client that saw only the job's first events
    assert int(cursor) == _count(env, "SELECT max(rowid) FROM job_events")
    later = _latest_completion(env) + 100 * DAY_MS
    # The only finished job owns the newest event row: deleting it would let SQLite reuse its id
    report = prune(env.engine, POLICY, now=later)
    assert report.jobs == 0 and report.held == 1
    # Once any newer event exists, it may go; the maximum id stays where it was or above
    second = env.submit("ok")
    newest = _count(env, "SELECT max(rowid) FROM job_events")
    assert newest > int(cursor)
    assert prune(env.engine, POLICY, now=later).jobs == 1
    assert _ids(env) == {second.id}
    assert _count(env, "SELECT max(rowid) FROM job_events") == newest
    # A client resuming at its cursor sees exactly the newer changes, and new ids keep growing
    assert _run(env, second.id) == "succeeded"
    resumed = changes_after(env.engine, cursor, is_admin=True)
    assert resumed.items and all(int(c.cursor) > int(cursor) and c.job_id == second.id for c in resumed.items)
    assert min(int(c.cursor) for c in resumed.items) == newest and int(resumed.cursor) > newest
    # A client resuming from before the deleted events is told so (the web layer answers it with a
    # resync, cursor_expired), never handed a silent gap; one at the head of that time is not (above)
    with pytest.raises(CursorExpired):
        changes_after(env.engine, early, is_admin=True)


def test_batches_are_bounded_and_two_runs_at_once_delete_each_row_once(env: JobEnv) -> None:
    _declare(env)
    done = [env.submit("chatty", payload={"n": 3}) for _ in range(12)]
    for job in done:
        assert _run(env, job.id) == "succeeded"
    live = env.submit("ok")
    later = _latest_completion(env) + 2 * DAY_MS
    policy = RetentionPolicy(jobs_s=POLICY.jobs_s, events_s=POLICY.events_s, batch=5)
    # No time: nothing is done, and the report says the run stopped early
    stopped = prune(env.engine, RetentionPolicy(jobs_s=POLICY.jobs_s, time_budget_s=0), now=later)
    assert stopped == PruneReport(complete=False)

    # When two runs (two engines, as two processes) prune at once, with 5 rows per statement
    deletes: list[tuple[str, int]] = []
    engines = [make_engine(env.url) for _ in "ab"]

    def record(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("DELETE"):
            deletes.append((statement.split()[2], cursor.rowcount))

    reports: list[PruneReport] = []
    errors: list[BaseException] = []

    def run(engine: Any) -> None:
        try:
            reports.append(prune(engine, policy, now=later))
        except BaseException as e:  # surfaced below
            errors.append(e)

    try:
        for e in engines:
            event.listen(e, "after_cursor_execute", record)
        threads = [threading.Thread(target=run, args=(e,)) for e in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for e in engines:
            e.dispose()
    # Then every finished job went exactly once, and no statement deleted more than a batch
    assert errors == []
    assert sum(r.jobs for r in reports) == 12
    assert _ids(env) == {live.id}
    assert _count(env, "SELECT count(*) FROM job_events WHERE job_id <> :j", j=live.id) == 0
    assert {table for table, _ in deletes} >= {"job_events", "jobs"}
    assert max(n for _, n in deletes) <= 5, deletes


def test_policy_is_the_environment_overlaid_by_saved_runtime_settings(sqlite_env: JobEnv) -> None:
    engine = sqlite_env.engine
    settings = Settings(
        database_url=sqlite_env.url, broker_url=sqlite_env.url, retention_succeeded_days=2, retention_events_days=9
    )
    policy = effective_policy(engine, settings)
    assert policy.jobs_s == {"succeeded": 2 * DAY_S, "failed": 30 * DAY_S, "cancelled": 30 * DAY_S,
                             "interrupted": 30 * DAY_S}  # fmt: skip
    assert policy.events_s == 9 * DAY_S
    view = rs.put_settings(
        engine, {"retention.finished_jobs_days": 5, "retention.failed_jobs_days": 40}, 0, "root", settings=settings
    )
    # a saved per-status key beats the saved all-statuses key, which beats the environment
    assert view["effective"]["retention.succeeded_jobs_days"] == 5
    assert view["effective"]["retention.failed_jobs_days"] == 40
    policy = effective_policy(engine, settings)
    assert policy.jobs_s == {"succeeded": 5 * DAY_S, "failed": 40 * DAY_S, "cancelled": 5 * DAY_S,
                             "interrupted": 5 * DAY_S}  # fmt: skip
    assert policy.events_s == 9 * DAY_S
    with pytest.raises(rs.SettingsInvalid) as info:
        rs.put_settings(engine, {"retention.cancelled_jobs_days": 0}, 1, "root")
    assert set(info.value.errors) == {"retention.cancelled_jobs_days"}
