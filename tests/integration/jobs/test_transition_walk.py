"""The status machine, walked pair by pair on SQLite and PostgreSQL (issue 14's acceptance).

1. The database itself refuses every move outside :data:`jobs.status.ALLOWED`: for each (from, to) of
   JobStatus × JobStatus a job in ``from`` gets a hand-written ``UPDATE jobs SET status = to`` that also
   sets what the CHECKs ask of ``to`` (so only the ``jobs_status_moves`` trigger can refuse it). Allowed
   pairs go through; every other pair, a finished job's own status written again included, raises.
2. Each move of ``ALLOWED`` is made by a function of :mod:`jobs.transitions`: every public function is
   driven once, each move it made is in ``ALLOWED``, and together they make all of ``ALLOWED``.
"""

from __future__ import annotations

import inspect
import itertools
import json
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from jobs import db, store, transitions
from jobs.lifecycle import AfterCommitBuffer
from jobs.status import ALLOWED, JobStatus

from .rows import WORKER, insert_jobs, job_row, status_columns
from .support import JobEnv

PAIRS = list(itertools.product(JobStatus, JobStatus))
LEASE_MS = 30_000


def _raw_move(env: JobEnv, job_id: str, to: JobStatus, now: int) -> IntegrityError | None:
    """``UPDATE jobs SET status = to …`` by hand, in its own transaction; the database's refusal, if any."""
    columns = status_columns(to, now)
    sets = ", ".join(f"{c} = :{c}" for c in columns)
    try:
        with env.engine.begin() as conn:
            changed = conn.execute(text(f"UPDATE jobs SET {sets} WHERE id = :id"), {**columns, "id": job_id})
            assert changed.rowcount == 1
    except IntegrityError as exc:
        return exc
    return None


def test_the_database_refuses_every_move_outside_allowed(env: JobEnv) -> None:
    # Given one job per (from, to) pair, in its from status
    now = store.now_ms()
    ids = {pair: uuid.uuid4().hex for pair in PAIRS}
    with env.engine.begin() as conn:
        insert_jobs(conn, [job_row(ids[(old, new)], old, created_at=now) for old, new in PAIRS])
    accepted, refused = set(), set()
    for (old, new), job_id in ids.items():
        # When the status is written by hand
        error = _raw_move(env, job_id, new, now + 1)
        # Then an allowed move is made; any other is refused by the status trigger and changes nothing
        if error is None:
            accepted.add((old, new))
            assert env.row(job_id).status == new
        else:
            refused.add((old, new))
            assert "jobs_status_moves" in str(error.orig), f"{old} → {new} refused by something else: {error.orig}"
            assert env.row(job_id).status == old
    assert accepted == ALLOWED
    assert refused == set(PAIRS) - ALLOWED
    assert all((old, new) in refused for old, new in PAIRS if old.terminal)


# -- every allowed move is made by a transition ------------------------------------------------------
class Walk:
    """Drives transitions on *env*'s database and records the status move each made."""

    def __init__(self, env: JobEnv) -> None:
        self.env = env
        self.moves: dict[str, set[tuple[JobStatus, JobStatus]]] = {}
        env.declare("walk_safe", lambda ctx: None)
        env.declare("walk_unsafe", lambda ctx: None, safe_to_rerun=False)
        env.declare("walk_once", lambda ctx: None, max_attempts=1)

    def status(self, job_id: str) -> JobStatus:
        return JobStatus(self.env.row(job_id).status)

    def drive(self, name: str, job_id: str, move: Callable[[db.Tx, int], Any]) -> Any:
        """Run ``move(tx, now)`` (a call of transition *name*) in a write transaction; it must take effect."""
        before = self.status(job_id)
        with db.write(self.env.engine) as tx:
            tx.broker = self.env.broker
            result = move(tx, store.now_ms())
        assert result not in (None, False), f"{name} changed nothing on a {before} job"
        self.record(name, job_id, before)
        return result

    def record(self, name: str, job_id: str, before: JobStatus) -> None:
        after = self.status(job_id)
        moves = self.moves.setdefault(name, set())
        if after != before:  # request_cancel only marks the running job: no status move
            moves.add((before, after))
        if after != before or name.startswith("claim"):
            # the move's status event, written by the transition in the same transaction
            data = self.env.sql(
                "SELECT data FROM job_events WHERE job_id = :id AND type = 'status' ORDER BY sequence DESC LIMIT 1",
                id=job_id,
            )
            assert json.loads(data[0][0])["status"] == after, f"{name}: no status event for {before} → {after}"

    # -- getting a job where a transition starts ------------------------------------------------------
    def queued(self, kind: str = "walk_safe") -> str:
        return self.env.submit(kind).id

    def running(self, kind: str = "walk_safe") -> str:
        job_id = self.queued(kind)
        self.claim(job_id)
        return job_id

    def claim(self, job_id: str, worker: str = WORKER) -> store.JobRow:
        return self.drive(
            "claim", job_id, lambda tx, now: transitions.claim(tx, job_id, worker=worker, lease_ms=LEASE_MS, now=now)
        )

    def attempt(self, job_id: str) -> transitions.Attempt:
        return transitions.Attempt.of(self.env.row(job_id))

    def expired(self, job_id: str) -> store.ExpiredJob:
        self.env.age_lease(job_id)
        with db.read(self.env.engine) as conn:
            (job,) = store.job_list_expired(conn, store.now_ms(), 1, job_id=job_id)
        return job


def _drive_every_transition(w: Walk) -> None:
    # Every argument is read before drive() opens its write transaction (SQLite: one writer at a time).
    t = transitions
    # claim: queued → running (a job under an expired lease is recovered first: see recover below)
    taken = w.running()
    # an execution's own outcomes
    a = w.attempt(taken)
    w.drive("complete", a.job_id, lambda tx, now: t.complete(tx, a, None, now=now))
    b = w.attempt(w.running())
    w.drive("fail", b.job_id, lambda tx, now: t.fail(tx, b, "RuntimeError: boom", now=now))
    stuck = w.attempt(w.running())
    w.drive(
        "time_out_still_exiting",
        stuck.job_id,
        lambda tx, now: t.time_out_still_exiting(tx, stuck, "JobTimeout: stuck", now=now, exit_lease_ms=LEASE_MS),
    )
    c = w.attempt(w.running())
    w.drive("cancel_running", c.job_id, lambda tx, now: t.cancel_running(tx, c, now=now))
    d = w.attempt(w.running())
    w.drive("requeue_for_retry", d.job_id, lambda tx, now: t.requeue_for_retry(tx, d, "x", delay_s=0, now=now))
    # control
    queued = w.env.row(w.queued())
    w.drive("cancel_queued", queued.id, lambda tx, now: t.cancel_queued(tx, queued, now=now, by="u1"))
    orphan = w.env.row(w.queued())
    w.drive("fail_queued", orphan.id, lambda tx, now: t.fail_queued(tx, orphan, "no worker", now=now))
    asked = w.env.row(w.running())
    w.drive("request_cancel", asked.id, lambda tx, now: t.request_cancel(tx, asked, now=now, by="u1"))
    # recovery of expired leases: a cancel request, a safe kind, a last attempt, an unsafe kind
    for job_id in (asked.id, w.running(), w.running("walk_once")):
        expired = w.expired(job_id)
        w.drive("recover", job_id, lambda tx, now, e=expired: t.recover(tx, e, now=now, broker=w.env.broker))
    unsafe = w.expired(w.running("walk_unsafe"))
    w.drive("interrupt", unsafe.id, lambda tx, now: t.interrupt(tx, unsafe, now=now))
    # workflow parents: started by their creation, finished by their steps
    for status in ("succeeded", "failed", "cancelled"):
        parent_id = w.queued()
        w.drive("start_workflow", parent_id, lambda tx, now, p=parent_id: t.start_workflow(tx, p, now=now) or True)
        parent = w.env.row(parent_id)
        w.drive("finish_workflow", parent_id, lambda tx, now, p=parent, s=status: t.finish_workflow(tx, p, s, now=now))
    if w.env.backend == "sqlite":
        _drive_the_batched_transitions(w)


def _drive_the_batched_transitions(w: Walk) -> None:
    """claim_many / complete_many: one statement for several jobs on one raw SQLite connection (the hot path)."""
    path = db.sqlite_path(w.env.url)
    assert path is not None
    ids = [w.queued(), w.queued()]
    raw = db.raw_connection(path, 5_000)
    try:
        for name in ("claim_many", "complete_many"):
            before = {job_id: w.status(job_id) for job_id in ids}
            attempts = [(w.attempt(job_id), None, None) for job_id in ids] if name == "complete_many" else []
            txs = [db.Tx(raw, AfterCommitBuffer()) for _ in ids]  # type: ignore[arg-type]
            raw.execute("BEGIN IMMEDIATE")
            if name == "claim_many":
                done = transitions.claim_many(txs, ids, worker=WORKER, lease_ms=LEASE_MS, now=store.now_ms())
            else:
                done = transitions.complete_many(txs, attempts, now=store.now_ms())
            raw.execute("COMMIT")
            for tx in txs:
                tx.pending.run()
            assert all(done), f"{name} changed nothing"
            for job_id in ids:
                w.record(name, job_id, before[job_id])
    finally:
        raw.close()


def test_every_allowed_move_is_made_by_a_transition(env: JobEnv) -> None:
    # Given every public function of jobs.transitions (the batched ones exist for SQLite's hot path only)
    public = {
        name
        for name, fn in vars(transitions).items()
        if inspect.isfunction(fn) and fn.__module__ == transitions.__name__ and not name.startswith("_")
    }
    if env.backend != "sqlite":
        public -= {"claim_many", "complete_many"}
    walk = Walk(env)
    # When each is driven where it applies
    _drive_every_transition(walk)
    # Then each was driven, every move one made is allowed, and together they make every allowed move
    assert set(walk.moves) == public
    for name, moves in walk.moves.items():
        assert moves <= ALLOWED, f"{name} made {moves - ALLOWED}"
    assert set().union(*walk.moves.values()) == ALLOWED
    assert walk.moves["recover"] == {
        (JobStatus.RUNNING, JobStatus.CANCELLED),
        (JobStatus.RUNNING, JobStatus.QUEUED),
        (JobStatus.RUNNING, JobStatus.FAILED),
    }
