"""The job layer's hot path: group-committed writes on SQLite, coalesced progress, lifecycle events
counted without per-job INFO lines."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, text

import jobs
from jobs import JobContext, db, transitions
from jobs.group_commit import Together, _committer, hot_write
from jobs.lifecycle import AfterCommitBuffer
from jobs.lifecycle import observers as lifecycle_observers
from jobs.limits import ConcurrencyLimit

from .support import JobEnv, observed


def _insert(tx: db.Tx, value: str, seen: list[str] | None = None) -> str:
    sql = "INSERT INTO hot (v) VALUES (:v)"
    tx.conn.execute(sql if isinstance(tx.conn, sqlite3.Connection) else text(sql), {"v": value})
    if seen is not None:
        tx.after_commit(lambda: seen.append(value))
    return value


def test_group_commit_fails_only_the_write_that_raised(sqlite_env: JobEnv) -> None:
    env = sqlite_env
    env.sql("CREATE TABLE hot (v TEXT PRIMARY KEY)")
    seen: list[str] = []
    results: dict[int, Any] = {}
    start = threading.Barrier(16)

    def writer(i: int) -> None:
        start.wait()
        value = "dup" if i % 5 == 0 else f"v{i}"  # four writers insert "dup": three must fail alone
        try:
            results[i] = hot_write(env.engine, lambda tx: _insert(tx, value, seen))
        except Exception as e:
            results[i] = e

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    failed = [i for i, r in results.items() if isinstance(r, Exception)]
    assert len(results) == 16
    assert len(failed) == 3 and all(i % 5 == 0 for i in failed)
    rows = sorted(r[0] for r in env.sql("SELECT v FROM hot"))
    assert rows == sorted({"dup"} | {f"v{i}" for i in range(16) if i % 5})
    # After-commit work only for writes that committed, once each (the failed writers' was dropped).
    assert sorted(seen) == rows


def test_group_commit_rolls_back_a_write_that_raised_after_writing(sqlite_env: JobEnv) -> None:
    env = sqlite_env
    env.sql("CREATE TABLE hot (v TEXT PRIMARY KEY)")

    def half(tx: db.Tx) -> None:
        _insert(tx, "half")
        raise RuntimeError("after the insert")

    with pytest.raises(RuntimeError):
        hot_write(env.engine, half)
    assert hot_write(env.engine, lambda tx: _insert(tx, "whole")) == "whole"
    assert [r[0] for r in env.sql("SELECT v FROM hot")] == ["whole"]


def _progress_row(env: JobEnv, job_id: str) -> tuple[Any, Any]:
    with env.engine.connect() as conn:
        return tuple(
            conn.execute(text("SELECT progress, progress_message FROM jobs WHERE id = :id"), {"id": job_id}).one()
        )


def test_progress_is_coalesced_then_written_by_the_keeper_or_the_completion(env: JobEnv) -> None:
    def fn(ctx: JobContext) -> str:
        ctx.progress(0.5, "half way")
        return "done"

    env.declare("coalesced", fn)
    job = env.submit("coalesced")
    ctx = env.claim(job.id)
    assert ctx is not None
    ctx.progress(0.2, "first")
    ctx.progress(0.3, None)
    # Within PROGRESS_INTERVAL_S of the claim nothing is written yet…
    assert _progress_row(env, job.id) == (None, None)
    # …the keeper writes the latest value (a message-less report kept the last message).
    env.mw.worker.track(ctx)
    env.mw.keeper.flush_progress()
    env.mw.worker.untrack(ctx)
    assert _progress_row(env, job.id) == (0.3, None)
    # A report made just before returning is written with the completion.
    env.mw.runner(ctx)
    assert _progress_row(env, job.id) == (1.0, "half way")
    assert jobs.get_job(env.engine, job.id, owner_id="u1").status == "succeeded"


def test_progress_due_is_written_at_once(env: JobEnv) -> None:
    env.declare("due", lambda ctx: None)
    job = env.submit("due")
    ctx = env.claim(job.id)
    assert ctx is not None
    ctx._progress_due = 0.0  # as if PROGRESS_INTERVAL_S had passed since the claim
    ctx.progress(0.7, "now")
    assert _progress_row(env, job.id) == (0.7, "now")


def test_an_event_writes_the_pending_progress_first(env: JobEnv) -> None:
    env.declare("ordered", lambda ctx: None)
    job = env.submit("ordered")
    ctx = env.claim(job.id)
    assert ctx is not None
    ctx.progress(0.4, "before the event")
    ctx.event("milestone", n=1)
    assert _progress_row(env, job.id) == (0.4, "before the event")


def test_completed_jobs_are_counted_by_observers_without_info_lines(
    sqlite_env: JobEnv, caplog: pytest.LogCaptureFixture
) -> None:
    env = sqlite_env
    env.declare("quiet", lambda ctx: None)
    env.declare("loud", lambda ctx: 1 / 0, max_attempts=1)
    seen: list[dict[str, Any]] = []
    lifecycle_observers.append(seen.append)
    try:
        with caplog.at_level(logging.INFO, logger="tenure.lifecycle"):
            for kind in ("quiet", "loud"):
                ctx = env.claim(env.submit(kind).id)
                assert ctx is not None
                env.mw.runner(ctx)
    finally:
        lifecycle_observers.remove(seen.append)
    events = [(f["event"], f["kind"]) for f in seen]
    assert ("job.started", "quiet") in events and ("job.completed", "quiet") in events
    assert ("job.failed", "loud") in events
    lines = [r.getMessage() for r in caplog.records if r.name == "tenure.lifecycle"]
    assert any(line.startswith("job.failed") for line in lines)
    assert not any(line.startswith(("job.completed", "job.started")) for line in lines)


def test_a_job_completed_in_its_result_transaction_is_counted_once(sqlite_env: JobEnv) -> None:
    # Given a kind that completes in its own result_transaction (as import, transcribe and render do)
    env = sqlite_env

    def in_transaction(ctx: JobContext) -> None:
        with ctx.result_transaction() as tx:
            tx.complete({"n": 1})

    env.declare("transactional", in_transaction)
    seen: list[dict[str, Any]] = []
    lifecycle_observers.append(seen.append)
    try:
        # When it runs
        job = env.submit("transactional")
        ctx = env.claim(job.id)
        assert ctx is not None
        env.mw.runner(ctx)
    finally:
        lifecycle_observers.remove(seen.append)

    # Then it succeeded and the observers were told once, with its outcome (what the metrics count)
    assert env.row(job.id).status == "succeeded"
    completed = [f for f in seen if f["event"] == "job.completed"]
    assert [(f["kind"], f["outcome"]) for f in completed] == [("transactional", "succeeded")]


# -- completion committed with the message's ack (SQLite broker on the job file) ----------------------
class _AckedMessage:
    """Where the completer hands a success to the message's ack: ``SQLiteMessageProxy.in_ack_transaction``'s
    side of it, so the test runs the hook in a transaction of its own choosing."""

    def __init__(self) -> None:
        self.hooks: list[Any] = []

    def in_ack_transaction(self, hook: Any) -> None:
        self.hooks.append(hook)


def _deferred(env: JobEnv, fn: Any = None, *, declare: bool = True) -> tuple[str, JobContext]:
    if declare:
        env.declare("acked", fn or (lambda ctx: {"n": 1}))
    job = env.submit("acked")
    ctx = env.claim(job.id)
    assert ctx is not None
    ctx.settle_with = _AckedMessage()  # as before_process_message sets it
    ctx.progress(0.5, "last words")
    env.mw.runner(ctx)
    assert env.row(job.id).status == "running"  # nothing written yet: it waits for the ack
    return job.id, ctx


def _hook(ctx: JobContext) -> Any:
    [hook] = ctx.settle_with.hooks
    return hook


def _run_in_ack_transaction(env: JobEnv, ctx: JobContext) -> None:
    hook = _hook(ctx)
    conn = db.raw_connection(env.engine.url.database or "", 5000)
    try:
        conn.execute("BEGIN IMMEDIATE")
        after = hook(conn)
        conn.execute("COMMIT")
    finally:
        conn.close()
    after()


def test_completion_commits_in_the_ack_transaction(sqlite_env: JobEnv) -> None:
    env = sqlite_env
    job_id, ctx = _deferred(env)
    _run_in_ack_transaction(env, ctx)
    row = env.row(job_id)
    assert (row.status, row.result, row.progress, row.progress_message) == ("succeeded", '{"n":1}', 1.0, "last words")
    assert ctx.completed
    statuses = [e.data for e in jobs.job_events(env.engine, job_id, owner_id="u1") if e.type == "status"]
    assert [s["status"] for s in statuses] == ["queued", "running", "succeeded"]


def test_a_cancel_committed_before_the_ack_wins(sqlite_env: JobEnv) -> None:
    env = sqlite_env
    job_id, ctx = _deferred(env)
    assert jobs.cancel(env.engine, job_id, by="u1").outcome == jobs.CancelOutcome.REQUESTED
    _run_in_ack_transaction(env, ctx)
    row = env.row(job_id)
    assert (row.status, row.result) == ("cancelled", None)
    assert not ctx.completed


def test_a_superseded_attempt_completes_nothing_at_ack(sqlite_env: JobEnv) -> None:
    env = sqlite_env
    job_id, ctx = _deferred(env)
    env.age_lease(job_id)
    newer = env.claim(job_id, env.worker())
    assert newer is not None and newer.attempt == 2
    before = env.row(job_id)
    _run_in_ack_transaction(env, ctx)
    assert env.row(job_id) == before
    assert ctx.lost and not ctx.completed


def _in_one_transaction(env: JobEnv, fn: Any) -> Any:
    conn = db.raw_connection(env.engine.url.database or "", 5000)
    try:
        conn.execute("BEGIN IMMEDIATE")
        result = fn(conn)
        conn.execute("COMMIT")
        return result
    finally:
        conn.close()


def test_the_claims_of_one_ack_batch_are_one_statement_with_the_guards_of_each(sqlite_env: JobEnv) -> None:
    from jobs.execution.claimer import _ClaimRequest

    env = sqlite_env
    env.declare("batched", lambda ctx: None)
    fresh, duplicate_of, finished = (env.submit("batched").id for _ in range(3))
    assert jobs.cancel(env.engine, finished, by="u1").outcome == jobs.CancelOutcome.CANCELLED
    seen: list[dict[str, Any]] = []
    lifecycle_observers.append(seen.append)
    ids = [fresh, duplicate_of, duplicate_of, finished]  # the same job twice: a duplicate delivery
    requests = [_ClaimRequest(i, lambda tx: pytest.fail("the batch ran every claim")) for i in ids]
    try:
        claimed = _in_one_transaction(env, lambda conn: env.mw.claimer._batch(conn, requests))
        for r in requests:
            r.pending.run()
    finally:
        lifecycle_observers.remove(seen.append)
    assert [None if c is None else c.id for c in claimed] == [fresh, duplicate_of, None, None]
    for job_id in (fresh, duplicate_of):
        row = env.row(job_id)
        assert (row.status, row.attempt, row.worker_id) == ("running", 1, env.mw.worker_id)
        statuses = [e.data for e in jobs.job_events(env.engine, job_id, owner_id="u1") if e.type == "status"]
        assert statuses == [{"status": "queued"}, {"status": "running", "attempt": 1}]
    assert env.row(finished).status == "cancelled"
    started = [(f["job_id"], f["event"]) for f in seen]
    assert sorted(started) == sorted([(fresh, "job.started"), (duplicate_of, "job.started")])


def test_the_completions_of_one_ack_batch_settle_each_by_its_own_guard(sqlite_env: JobEnv) -> None:
    env = sqlite_env
    contexts = [_deferred(env, declare=i == 0) for i in range(3)]
    (done_id, done), (cancel_id, cancelled), (stale_id, stale) = contexts
    assert jobs.cancel(env.engine, cancel_id, by="u1").outcome == jobs.CancelOutcome.REQUESTED
    env.age_lease(stale_id)
    assert env.claim(stale_id, env.worker()) is not None
    before_stale = env.row(stale_id)
    completions = [_hook(c) for c in (done, cancelled, stale)]
    afters = _in_one_transaction(env, lambda conn: completions[0].batch(conn, completions))
    for after in afters:
        after()
    row = env.row(done_id)
    assert (row.status, row.result, row.progress, row.progress_message) == ("succeeded", '{"n":1}', 1.0, "last words")
    assert done.completed
    assert (env.row(cancel_id).status, env.row(cancel_id).result) == ("cancelled", None) and not cancelled.completed
    assert env.row(stale_id) == before_stale and stale.lost and not stale.completed
    for job_id, final in ((done_id, "succeeded"), (cancel_id, "cancelled")):
        statuses = [e.data["status"] for e in jobs.job_events(env.engine, job_id, owner_id="u1") if e.type == "status"]
        assert statuses == ["queued", "running", final]


def test_a_real_worker_completes_jobs_through_its_acks(sqlite_env: JobEnv) -> None:
    import dramatiq

    env = sqlite_env
    env.declare("through_acks", lambda ctx: ctx.progress(1.0, "done") or "ok")
    env.broker.add_middleware(env.mw)
    ids = [env.submit("through_acks").id for _ in range(20)]
    worker = dramatiq.Worker(env.broker, worker_threads=4, worker_timeout=50)
    worker.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done = env.sql("SELECT count(*) FROM jobs WHERE status = 'succeeded'")[0][0]
            if done == len(ids):
                break
            time.sleep(0.05)
    finally:
        worker.stop()
    rows = [env.row(i) for i in ids]
    assert all((r.status, r.result, r.progress_message) == ("succeeded", '"ok"', "done") for r in rows)
    assert env.sql("SELECT count(*) FROM broker_messages")[0][0] == 0  # acked in the same transactions
    assert list(env.mw.worker._ack_file.values()) == [True]  # the completions did ride on the acks


# -- claims and successes of one group-committed batch (hot_write's Together) -------------------------
def test_writes_of_one_kind_in_a_batch_run_together_and_one_that_raises_fails_alone(env: JobEnv) -> None:
    env.sql("CREATE TABLE hot (v TEXT PRIMARY KEY)")
    calls: list[list[str]] = []
    seen: list[str] = []
    results: dict[int, Any] = {}

    def together(txs: list[db.Tx], values: list[str]) -> list[str]:
        calls.append(values)
        return [_insert(tx, value, seen) for tx, value in zip(txs, values, strict=True)]

    def writer(i: int, value: str) -> None:
        try:
            results[i] = hot_write(env.engine, lambda tx: _insert(tx, value, seen), Together(together, value))
        except Exception as e:
            results[i] = e

    def one_batch(values: dict[int, str]) -> None:
        """The writes of *values* queued while the writer thread is held inside another: one batch."""
        running, hold = threading.Event(), threading.Event()
        first = threading.Thread(target=hot_write, args=(env.engine, lambda tx: running.set() or hold.wait(10)))
        first.start()
        assert running.wait(10)
        threads = [threading.Thread(target=writer, args=item) for item in values.items()]
        for t in threads:
            t.start()
        committer, deadline = _committer(env.engine), time.monotonic() + 10
        while len(committer._pending) < len(values):
            assert time.monotonic() < deadline, "the writes were never queued"
            time.sleep(0.001)
        hold.set()
        for t in [first, *threads]:
            t.join(10)

    # Four writers insert "dup": the batch raises, each write then runs alone, and three fail alone
    one_batch({i: "dup" if i % 5 == 0 else f"v{i}" for i in range(16)})
    assert [len(c) for c in calls] == [16]
    failed = [i for i, r in results.items() if isinstance(r, Exception)]
    assert len(failed) == 3 and all(i % 5 == 0 for i in failed)
    rows = sorted(r[0] for r in env.sql("SELECT v FROM hot"))
    assert rows == sorted({"dup"} | {f"v{i}" for i in range(16) if i % 5})
    assert sorted(seen) == rows  # after-commit work once per committed write

    # A batch that does not raise commits as it ran: one call for all of them
    calls.clear()
    one_batch({i: f"w{i}" for i in range(8)})
    assert [sorted(c) for c in calls] == [sorted(f"w{i}" for i in range(8))]
    assert [results[i] for i in range(8)] == [f"w{i}" for i in range(8)]


class _Recording(sqlite3.Connection):
    """A raw connection that records the statements run on it (SQLite's own trace repeats a statement at
    each run of its triggers, and shows the search index's internal reads)."""

    statements: list[str]

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        self.statements.append(sql)
        return super().execute(sql, *args)


@contextmanager
def _batch_connection(env: JobEnv) -> Iterator[tuple[Any, list[str]]]:
    """The connection a group-committed batch runs on (SQLite: a raw one, set up as ``db.raw_connection``
    sets it up), in a transaction that commits at the end, and the statements run on it."""
    statements: list[str] = []
    if env.backend == "sqlite":
        conn = sqlite3.connect(env.engine.url.database or "", isolation_level=None, factory=_Recording)
        conn.statements = []
        for pragma in ("busy_timeout = 5000", "synchronous = NORMAL", "foreign_keys = ON"):
            conn.execute(f"PRAGMA {pragma}")
        conn.statements = statements
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield conn, statements
            conn.execute("COMMIT")
        finally:
            conn.close()
        return
    with env.engine.begin() as conn:
        event.listen(conn, "before_cursor_execute", lambda *args: statements.append(args[2]))
        yield conn, statements


def test_the_claims_and_successes_of_a_group_committed_batch_are_one_update_each_with_the_guards_of_each(
    env: JobEnv,
) -> None:
    from jobs.execution.completer import _successes_together

    env.declare("together", lambda ctx: None)
    fresh, duplicate_of, finished, to_cancel, superseded = (env.submit("together").id for _ in range(5))
    assert jobs.cancel(env.engine, finished, by="u1").outcome == jobs.CancelOutcome.CANCELLED
    ids = [fresh, duplicate_of, duplicate_of, finished, to_cancel, superseded]  # the same job twice: a duplicate
    with observed() as told:
        with _batch_connection(env) as (conn, statements):
            txs = [db.Tx(conn, AfterCommitBuffer()) for _ in ids]
            claimed = env.mw.claimer._together(txs, [(job_id, transitions.NO_LIMITS, env.broker) for job_id in ids])
        for tx in txs:
            tx.pending.run()
    assert [None if c is None else c.id for c in claimed] == [fresh, duplicate_of, None, None, to_cancel, superseded]
    assert len([s for s in statements if s.startswith("UPDATE jobs SET status = 'running'")]) == 1
    for job_id in (fresh, duplicate_of, to_cancel, superseded):
        row = env.row(job_id)
        assert (row.status, row.attempt, row.worker_id) == ("running", 1, env.mw.worker_id)
        statuses = [e.data for e in jobs.job_events(env.engine, job_id, owner_id="u1") if e.type == "status"]
        assert statuses == [{"status": "queued"}, {"status": "running", "attempt": 1}]
    assert env.row(finished).status == "cancelled"
    assert sorted((f["job_id"], f["event"]) for f in told) == sorted(
        (job_id, "job.started") for job_id in (fresh, duplicate_of, to_cancel, superseded)
    )

    # Successes: one succeeds, one had a cancel request committed first, one's attempt was superseded
    attempts = {c.id: transitions.Attempt.of(c) for c in claimed if c is not None}
    assert jobs.cancel(env.engine, to_cancel, by="u1").outcome == jobs.CancelOutcome.REQUESTED
    env.age_lease(superseded)
    assert env.claim(superseded, env.worker()) is not None
    before_superseded = env.row(superseded)
    successes = [(attempts[job_id], '{"n":1}', "last words", env.broker) for job_id in (fresh, to_cancel, superseded)]
    with _batch_connection(env) as (conn, statements):
        finals = _successes_together([db.Tx(conn, AfterCommitBuffer()) for _ in successes], successes)
    assert finals == ["succeeded", "cancelled", "stale"]
    # One statement for the batch. The two attempts it did not complete are settled alone: each tries its
    # own success (refused again), and the one with a cancel request is then cancelled.
    moves = [s for s in statements if s.startswith("UPDATE jobs SET status")]
    assert ["FROM (VALUES" in s for s in moves] == [True, False, False, False]
    row = env.row(fresh)
    assert (row.status, row.result, row.progress, row.progress_message) == ("succeeded", '{"n":1}', 1.0, "last words")
    assert env.row(to_cancel).status == "cancelled"
    assert env.row(superseded) == before_superseded
    for job_id, final in ((fresh, "succeeded"), (to_cancel, "cancelled")):
        statuses = [e.data["status"] for e in jobs.job_events(env.engine, job_id, owner_id="u1") if e.type == "status"]
        assert statuses == ["queued", "running", final]


def test_a_batch_counts_a_concurrency_key_once_gives_room_left_unused_to_the_next_job_and_returns_it_once(
    env: JobEnv,
) -> None:
    from jobs.execution.completer import _successes_together

    env.declare("keyed", lambda ctx: None, concurrency=ConcurrencyLimit("keyed.owner", limit=2))
    # Delayed jobs are admitted without counting (their messages wait in the broker): four queued jobs
    # of a key with room for two. One of them is cancelled before its message comes.
    cancelled, first, second, third = (env.submit("keyed", delay=60).id for _ in range(4))
    assert [env.row(i).held for i in (cancelled, first, second, third)] == [None] * 4
    assert jobs.cancel(env.engine, cancelled, by="u1").outcome == jobs.CancelOutcome.CANCELLED
    ids, key = [cancelled, first, second, third], "keyed.owner=u1"
    with _batch_connection(env) as (conn, statements):
        txs = [db.Tx(conn, AfterCommitBuffer()) for _ in ids]
        claimed = env.mw.claimer._together(txs, [(job_id, (key, None), env.broker) for job_id in ids])
    for tx in txs:
        tx.pending.run()
    # The cancelled job's claim found nothing: its room went to the next job, in a second statement
    assert [None if c is None else c.id for c in claimed] == [None, first, second, None]
    assert [env.row(i).status for i in ids] == ["cancelled", "running", "running", "queued"]
    assert (env.row(third).held, env.row(third).held_on) == ("concurrency", key)
    assert len([s for s in statements if s.startswith("SELECT count(*) FROM jobs WHERE concurrency_key")]) == 1
    assert len([s for s in statements if s.startswith("UPDATE jobs SET status = 'running'")]) == 2

    # Both succeed in one batch: the key's slots come back once, and the job waiting for it is admitted
    successes = [(transitions.Attempt.of(c), None, None, env.broker) for c in claimed if c is not None]
    with _batch_connection(env) as (conn, statements):
        txs = [db.Tx(conn, AfterCommitBuffer()) for _ in successes]
        assert _successes_together(txs, successes) == ["succeeded", "succeeded"]
    for tx in txs:
        tx.pending.run()
    assert (env.row(third).status, env.row(third).held) == ("queued", None)
    assert len([s for s in statements if s.startswith("SELECT 1 FROM jobs WHERE held")]) == 1


def test_activity_reads_the_window_scoped_by_owner(env: JobEnv) -> None:
    from datetime import UTC, datetime, timedelta

    from jobs.queries import activity

    def finished_since(engine: Any, since: datetime, *, owner_id: str | None, is_admin: bool = False) -> list[Any]:
        """One entry per finished job of the window (the buckets' counts), with its bucket's p50 run time."""
        rows = activity(engine, since=since, bucket_s=3 * 3600, owner_id=owner_id, is_admin=is_admin)
        return [r for r in rows for _ in range(r.succeeded + r.failed + r.cancelled + r.interrupted)]

    env.declare("short", lambda ctx: None)
    mine = [env.submit("short").id for _ in range(3)]
    theirs = env.submit("short", owner_id="u2").id
    queued = env.submit("short").id  # never runs: not in any window
    for job_id in [*mine, theirs]:
        ctx = env.claim(job_id)
        assert ctx is not None
        env.mw.runner(ctx)
    env.sql("UPDATE jobs SET completed_at = completed_at - 7200000 WHERE id = :id", id=mine[0])  # 2 h ago
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    own = finished_since(env.engine, hour_ago, owner_id="u1")
    assert len(own) == 2 and all(f.succeeded and f.run_p50_s is not None for f in own)
    assert len(finished_since(env.engine, hour_ago, owner_id=None, is_admin=True)) == 3
    assert len(finished_since(env.engine, hour_ago - timedelta(hours=2), owner_id="u1")) == 3
    assert queued not in mine
    with pytest.raises(ValueError):
        finished_since(env.engine, hour_ago, owner_id=None)
