"""Every status move a job can make: one function per move of :data:`jobs.status.ALLOWED`.

Each function runs inside the caller's open transaction (a :class:`jobs.db.Tx`) and does the whole
move:

- its guarded UPDATE, a named query of :mod:`jobs.store` whose ``WHERE`` names the state the move
  starts from (a move that matches nothing changed nothing: the function returns ``False``/``None``);
- the job's status event, in the same transaction; a move that ends an attempt writes there how it
  ended (``outcome``, one of :mod:`jobs.attempts`' outcomes) and, when the job moves on, ``next``;
  a lost lease is also told by a ``lease_expired`` event just before;
- what the move sets in motion in that transaction: a workflow step reaching a final status moves
  its workflow on (:func:`_step_finished`);
- what it tells once the transaction has committed: the lifecycle event of an execution's start or
  end (:func:`jobs.lifecycle.lifecycle`, counted into metrics by monitoring), queued with
  :meth:`jobs.db.Tx.after_commit`. A job that never ran (cancelled or failed while queued) tells none.

Nothing else changes a job's status; the database refuses any move not in ``ALLOWED`` (revision 0009's
triggers), so a hand-written UPDATE cannot make one either.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from . import admission, attempts, dag, events, exit_store, store
from .admission_store import STEPS, HeldJob
from .db import Tx
from .lifecycle import lifecycle
from .status import TERMINAL_STATUSES, JobStatus

#: The error of a job whose last attempt's worker was lost (a safe kind with no attempt left).
LOST_LAST_ATTEMPT = "The worker running the last attempt was lost."
#: The error of an interrupted job: what a person reviewing it needs to know.
INTERRUPTED_HINT = (
    "Interrupted: the worker was lost while this job was running. It may have had external effects, so it "
    "was not re-run automatically; review it and retry it if needed."
)
#: Why recovery moved a job (its status event's ``reason``).
LEASE_EXPIRED = "lease expired"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One execution of a job: the identity that fences every write it makes."""

    job_id: str
    owner_id: str
    kind: str
    attempt: int
    worker_id: str
    parent_job_id: str | None = None
    #: ``time.monotonic()`` at the claim (None for an attempt not made by a claim in this process).
    started_monotonic: float | None = None
    #: The job's concurrency key: its slot comes back when this attempt stops running (jobs.admission).
    concurrency_key: str | None = None

    @classmethod
    def of(cls, job: store.JobRow, *, started_monotonic: float | None = None) -> Attempt:
        assert job.worker_id is not None, "only a running job has an attempt"
        return cls(
            job.id,
            job.owner_id,
            job.kind,
            job.attempt,
            job.worker_id,
            job.parent_job_id,
            started_monotonic,
            job.concurrency_key,
        )

    @classmethod
    def expired(cls, job: store.ExpiredJob) -> Attempt:
        """The attempt of a running job whose lease expired (its worker is gone)."""
        return cls(
            job.id, job.owner_id, job.kind, job.attempt, job.worker_id, job.parent_job_id, None, job.concurrency_key
        )

    def elapsed_s(self) -> float | None:
        return None if self.started_monotonic is None else time.monotonic() - self.started_monotonic


def _tell(tx: Tx, event: str, job_id: str, kind: str, attempt: int, **fields: Any) -> None:
    tx.after_commit(partial(lifecycle, event, job_id, kind, attempt, **fields))


def _host(worker_id: str) -> str:
    # worker ids are "host:pid:random" (jobs.execution.worker); a workflow's is "workflow"
    return worker_id.split(":", 1)[0]


# -- claim ------------------------------------------------------------------------------------------
#: A job's ``(concurrency key, rate key)`` as its message names them (``jobs.publish.LIMITS_OPTION``).
NO_LIMITS: tuple[str | None, str | None] = (None, None)


def claim(
    tx: Tx,
    job_id: str,
    *,
    worker: str,
    lease_ms: int,
    now: int,
    limits: tuple[str | None, str | None] = NO_LIMITS,
) -> store.JobRow | None:
    """queued → running (``attempt + 1``, this worker, a fresh lease). None when the job is not queued
    (cancelled, finished, running: one under an expired lease is recovered first, see
    :func:`jobs.recovery.recover_in`), out of attempts, waiting for admission, or — for a job with
    *limits* — when its key is at its limit: it then waits for the key (:func:`jobs.admission.claim_refusal`).

    Admits the waiting jobs the claim made room for, in the same transaction."""
    job = _claim_one(tx, job_id, worker=worker, lease_ms=lease_ms, now=now, limits=limits)
    if job is not None:
        admission.after_claims(tx, [job.queue_name], [job.rate_key] if job.rate_key else [], now=now)
    return job


def _claim_one(
    tx: Tx, job_id: str, *, worker: str, lease_ms: int, now: int, limits: tuple[str | None, str | None]
) -> store.JobRow | None:
    if limits != NO_LIMITS:
        refusal = admission.claim_refusal(tx, job_id, limits, now=now)
        if refusal is not None:
            admission.claim_refused(tx, job_id, refusal, now=now)
            return None
        # The key's lock may have been waited for: the start is now, after the runs that ended meanwhile.
        now = max(now, store.now_ms())
    job = store.job_claim(tx.conn, job_id, worker, now, lease_ms)
    if job is not None:
        events.status_event(tx, job_id=job.id, sequence=job.event_seq, status="running", now=now, attempt=job.attempt)
        admission.started(tx, job.rate_key, now=now)
        _tell(tx, "job.started", job.id, job.kind, job.attempt)
    return job


def claim_many(
    txs: Sequence[Tx],
    job_ids: Sequence[str],
    *,
    worker: str,
    lease_ms: int,
    now: int,
    limits: Sequence[tuple[str | None, str | None]] | None = None,
) -> list[store.JobRow | None]:
    """:func:`claim` for several jobs in one transaction (the *txs* share one connection, each with its own
    after-commit work): one statement for the jobs without limits and those their concurrency key has room
    for (each key locked and counted once for the batch; the others wait for it), then the jobs with a
    rate key one by one. A job named twice is claimed once (the later request gets None)."""
    limits = limits or [NO_LIMITS] * len(job_ids)
    # Keys locked in one order by every batch: two batches sharing keys never wait for each other in a circle.
    keys = sorted({key for key, rate_key in limits if key is not None and rate_key is None})
    rooms = {key: admission.concurrency_room(txs[0], key) for key in keys}
    sent: dict[str, list[str]] = {key: [] for key in keys}  # a limited key's jobs in the statement about to run
    past: dict[str, list[int]] = {key: [] for key in keys}  # the positions of its jobs past its room, in order
    claiming: list[str] = []
    for i, (job_id, (key, rate_key)) in enumerate(zip(job_ids, limits, strict=True)):
        if rate_key is not None:
            continue
        if key is not None:
            room = rooms[key]
            if room == 0:
                past[key].append(i)
                continue
            if room is not None:
                rooms[key] = room - 1
                sent[key].append(job_id)
        claiming.append(job_id)
    if rooms:
        now = max(now, store.now_ms())  # the keys' locks may have been waited for: the start is now
    claimed: dict[str, store.JobRow] = {}
    while claiming:
        got = store.job_claim_many(txs[0].conn, claiming, worker, now, lease_ms)
        claimed.update(got)
        # Room a claim did not use (its job was no longer queued) goes to the next job past the room.
        claiming = []
        for key, ids in sent.items():
            unused = sum(job_id not in got for job_id in ids)
            ids[:] = [job_ids[i] for i in past[key][:unused]]
            del past[key][:unused]
            claiming += ids
    events.status_events_many(
        txs[0].conn, now, [(j.id, j.event_seq, "running", {"attempt": j.attempt}) for j in claimed.values()]
    )
    waiting = {i: key for key, positions in past.items() for i in positions}
    jobs: list[store.JobRow | None] = []
    for i, (tx, job_id, keys) in enumerate(zip(txs, job_ids, limits, strict=True)):
        job: store.JobRow | None = None
        if i in waiting:
            admission.claim_refused(tx, job_id, admission.Verdict(admission.CONCURRENCY, waiting[i]), now=now)
        elif keys[1] is not None:
            job = _claim_one(tx, job_id, worker=worker, lease_ms=lease_ms, now=now, limits=keys)
        else:
            job = claimed.pop(job_id, None)
            if job is not None:
                _tell(tx, "job.started", job.id, job.kind, job.attempt)
        jobs.append(job)
    started = [j for j in jobs if j is not None]
    if started:
        admission.after_claims(
            txs[0], [j.queue_name for j in started], [j.rate_key for j in started if j.rate_key], now=now
        )
    return jobs


# -- an execution's own outcome (guarded by its attempt) --------------------------------------------
def complete(tx: Tx, attempt: Attempt, result: str | None, *, now: int, progress_message: str | None = None) -> bool:
    """running → succeeded with *result* (JSON text), unless a cancel request committed first.

    *progress_message*: this attempt's last status line not yet written."""
    seq = store.job_complete_if_current(
        tx.conn, attempt.job_id, attempt.attempt, attempt.worker_id, result, now, progress_message
    )
    if seq is None:
        return False
    _attempt_ended(tx, attempt, seq, "succeeded", now, outcome=attempts.SUCCEEDED)
    _finished(tx, attempt, "succeeded", now)
    _stopped_running(tx, attempt, now)
    return True


def complete_many(
    txs: Sequence[Tx], completions: Sequence[tuple[Attempt, str | None, str | None]], *, now: int
) -> list[bool]:
    """:func:`complete` for several attempts in one statement (the *txs* share one connection).

    *completions*: ``(attempt, result, progress_message)`` of jobs that are no workflow steps. Returns,
    in order, whether each was completed; the others (stale, or a cancel request committed first) are
    untouched."""
    assert all(a.parent_job_id is None for a, _, _ in completions), "a workflow step completes alone"
    done = store.job_complete_many(
        txs[0].conn,
        [(a.job_id, a.attempt, a.worker_id, result, message) for a, result, message in completions],
        now,
    )
    completed = [a.job_id in done for a, _, _ in completions]
    events.status_events_many(
        txs[0].conn,
        now,
        [
            (a.job_id, done[a.job_id], "succeeded", {"attempt": a.attempt, "outcome": attempts.SUCCEEDED})
            for a, _, _ in completions
            if a.job_id in done
        ],
    )
    for tx, (a, _, _), ok in zip(txs, completions, completed, strict=True):
        if ok:
            _tell(tx, "job.completed", a.job_id, a.kind, a.attempt, outcome="succeeded", duration_s=a.elapsed_s())
    # Each key's slots come back once for the batch, keys in the order claims lock them.
    for key in sorted({a.concurrency_key for a, _, _ in completions if a.concurrency_key and a.job_id in done}):
        admission.released(txs[0], queue=None, concurrency_key=key, rate_key=None, now=now)
    return completed


def fail(tx: Tx, attempt: Attempt, error: str, *, now: int, outcome: str = attempts.FAILED) -> bool:
    """running → failed (an error with no attempt left or that never retries, a timeout).

    *outcome*: how the attempt ended (:data:`jobs.attempts.FAILED` or :data:`~jobs.attempts.TIMED_OUT`)."""
    seq = store.job_finish_if_current(tx.conn, attempt.job_id, attempt.attempt, attempt.worker_id, "failed", error, now)
    if seq is None:
        return False
    _attempt_ended(tx, attempt, seq, "failed", now, outcome=outcome, error=error)
    _finished(tx, attempt, "failed", now)
    _stopped_running(tx, attempt, now)
    return True


def time_out_still_exiting(tx: Tx, attempt: Attempt, error: str, *, now: int, exit_lease_ms: int) -> bool:
    """running → failed for an attempt past its timeout whose thread does not stop (stuck in C code).

    The attempt ends ``timed out``, and a ``job_exits`` row keeps it *still exiting* while its thread runs:
    its worker's keeper renews that row's lease until the thread returns and the runner deletes it
    (:mod:`jobs.exit_store`); a manual retry waits for it (:func:`jobs.control.retry`); if the worker dies,
    the lease expires and recovery ends it. Those writes change no status, so they are not transitions."""
    if not fail(tx, attempt, error, now=now, outcome=attempts.TIMED_OUT):
        return False
    exit_store.exit_insert(tx.conn, attempt.job_id, attempt.attempt, attempt.worker_id, now, now + exit_lease_ms)
    return True


def cancel_running(tx: Tx, attempt: Attempt, *, now: int) -> bool:
    """running → cancelled: the execution honoured a cancel request (or a cancel request beat its success)."""
    seq = store.job_finish_if_current(
        tx.conn, attempt.job_id, attempt.attempt, attempt.worker_id, "cancelled", None, now
    )
    if seq is None:
        return False
    _attempt_ended(tx, attempt, seq, "cancelled", now, outcome=attempts.CANCELLED)
    _finished(tx, attempt, "cancelled", now)
    _stopped_running(tx, attempt, now)
    return True


def requeue_for_retry(tx: Tx, attempt: Attempt, error: str, *, delay_s: float, now: int) -> bool:
    """running → queued for the next attempt after *delay_s*, its message written in this transaction.

    False (nothing changed) when this attempt is not current, was the last one, or a cancel was requested.
    """
    job = store.job_get(tx.conn, attempt.job_id)
    seq = store.job_requeue_for_retry(
        tx.conn, attempt.job_id, attempt.attempt, attempt.worker_id, error, now + int(delay_s * 1000), now
    )
    if seq is None or job is None:
        return False
    _attempt_ended(
        tx,
        attempt,
        seq,
        "queued",
        now,
        outcome=attempts.FAILED,
        error=error,
        retry_in_s=round(delay_s, 3),
        next=attempts.NEXT_RETRY,
    )
    admission.admit(tx, HeldJob.of(job, run_after=now + int(delay_s * 1000)), now=now, delay_ms=int(delay_s * 1000))
    _stopped_running(tx, attempt, now)
    _tell(
        tx,
        "job.retrying",
        attempt.job_id,
        attempt.kind,
        attempt.attempt,
        outcome="retrying",
        duration_s=attempt.elapsed_s(),
    )
    return True


def _attempt_ended(tx: Tx, attempt: Attempt, seq: int, status: str, now: int, *, outcome: str, **data: Any) -> None:
    """The status event of a move that ends *attempt*: the new status, the attempt and how it ended."""
    events.status_event(
        tx,
        job_id=attempt.job_id,
        sequence=seq,
        status=status,
        now=now,
        attempt=attempt.attempt,
        outcome=outcome,
        **data,
    )


# -- control (cancel, unknown kinds) ----------------------------------------------------------------
def cancel_queued(tx: Tx, job: store.JobRow, *, now: int, **data: Any) -> bool:
    """queued → cancelled at once (its message, when delivered, finds nothing to claim).

    *data*: what the status event records besides the status (``by``, ``reason``)."""
    return _cancel_queued(tx, job, now, data, advance=True)


def _cancel_queued(tx: Tx, job: store.JobRow, now: int, data: dict[str, Any], *, advance: bool) -> bool:
    seq = store.job_cancel_queued(tx.conn, job.id, now)
    if seq is None:
        return False
    events.status_event(tx, job_id=job.id, sequence=seq, status="cancelled", now=now, **data)
    _left_unstarted(tx, job, now)
    if advance and job.parent_job_id is not None:
        _step_finished(tx, job.id, "cancelled", now)
    return True


def fail_queued(tx: Tx, job: store.JobRow, error: str, *, now: int) -> bool:
    """queued → failed without running: no worker can run its kind."""
    seq = store.job_fail_queued(tx.conn, job.id, error, now)
    if seq is None:
        return False
    events.status_event(tx, job_id=job.id, sequence=seq, status="failed", now=now, error=error)
    _left_unstarted(tx, job, now)
    if job.parent_job_id is not None:
        _step_finished(tx, job.id, "failed", now)
    return True


def request_cancel(tx: Tx, job: store.JobRow, *, now: int, by: str) -> bool:
    """A running job's cancel request (the first one wins): it stops at its next checkpoint and can no
    longer succeed. A workflow's request reaches its steps; the workflow ends cancelled once none runs."""
    seq = store.job_request_cancel(tx.conn, job.id, now)
    if seq is None:
        return False
    events.record(tx, job_id=job.id, sequence=seq, type_="cancel_requested", data={"by": by}, now=now)
    if job.worker_id == store.WORKFLOW_WORKER:
        children = store.job_children(tx.conn, job.id)
        _stop_steps(tx, children, now)
        parent = store.job_get(tx.conn, job.id)
        if parent is not None and all(c.status in TERMINAL_STATUSES for c in store.job_children(tx.conn, job.id)):
            finish_workflow(tx, parent, "cancelled", now=now)
    return True


# -- recovery of an expired lease (guarded on the expired lease, the attempt and its worker) ---------
def recover(tx: Tx, job: store.ExpiredJob, *, now: int, broker: Any) -> str | None:
    """An expired running job of a safe kind, or one whose cancel was requested: → cancelled if a cancel
    was requested, → queued with a fresh message (the next claim makes the next attempt), → failed if
    that was its last attempt. Returns ``"cancelled"``, ``"requeued"`` or ``"failed"``, or None when the
    guard matched nothing (a late heartbeat, another recovery, a claim got there first).

    The attempt ends ``lease lost — worker died``: a ``lease_expired`` event names the worker, its host
    and when the lease ran out, and the status event says what happened next."""
    attempt = Attempt.expired(job)
    if job.cancel_requested:
        status, error, outcome = "cancelled", None, "cancelled"
    elif job.attempt >= job.max_attempts:
        status, error, outcome = "failed", LOST_LAST_ATTEMPT, "failed"
    else:
        seq = store.job_recover_requeue(tx.conn, job.id, job.attempt, job.worker_id, now)
        if seq is None:
            return None
        _lease_lost(tx, job, seq, now, status="queued", next_=attempts.NEXT_REQUEUED)
        # The message carries the submit's stored trace context: the keeper recovers outside any span.
        requeued = HeldJob.of(job, run_after=now, created_at=now)
        admission.admit(tx, requeued, now=now, delay_ms=0, broker=broker)
        _stopped_running(tx, attempt, now)
        _tell(tx, "job.retrying", job.id, job.kind, job.attempt, outcome="retrying")
        return "requeued"
    seq = store.job_recover_finish(tx.conn, job.id, job.attempt, job.worker_id, status, error, now)
    if seq is None:
        return None
    _lease_lost(tx, job, seq, now, status=status, next_=status, **({"error": error} if error else {}))
    _finished(tx, attempt, status, now)
    _stopped_running(tx, attempt, now)
    return outcome


def interrupt(tx: Tx, job: store.ExpiredJob, *, now: int) -> bool:
    """An expired running job of a kind with external effects → interrupted, parked for a person to
    review: never replayed automatically. Its attempt ends ``lease lost — worker died`` (see :func:`recover`)."""
    seq = store.job_recover_finish(tx.conn, job.id, job.attempt, job.worker_id, "interrupted", INTERRUPTED_HINT, now)
    if seq is None:
        return False
    _lease_lost(tx, job, seq, now, status="interrupted", next_=attempts.NEXT_INTERRUPTED)
    attempt = Attempt.expired(job)
    _finished(tx, attempt, "interrupted", now)
    _stopped_running(tx, attempt, now)
    return True


def _lease_lost(tx: Tx, job: store.ExpiredJob, seq: int, now: int, *, status: str, next_: str, **data: Any) -> None:
    """The two events of a recovery (sequences ``seq - 1`` and ``seq``, reserved by its move): the lost
    lease (which attempt, worker and host, when it expired), then the status it led to."""
    lost = {"attempt": job.attempt, "worker": job.worker_id, "host": _host(job.worker_id)}
    events.record(
        tx,
        job_id=job.id,
        sequence=seq - 1,
        type_="lease_expired",
        data={**lost, "expired_at": datetime.fromtimestamp(job.lease_expires_at / 1000, UTC).isoformat()},
        now=now,
    )
    events.status_event(
        tx,
        job_id=job.id,
        sequence=seq,
        status=status,
        now=now,
        reason=LEASE_EXPIRED,
        **lost,
        outcome=attempts.LEASE_LOST,
        next=next_,
        **data,
    )


# -- workflow parents (driven by their steps, never leased) ------------------------------------------
def start_workflow(tx: Tx, parent_id: str, *, now: int) -> None:
    """A new workflow parent: queued → running, coordinated by its steps."""
    seq = store.job_workflow_start(tx.conn, parent_id, now)
    assert seq is not None, "a workflow starts in the transaction that created it"
    events.status_event(tx, job_id=parent_id, sequence=seq, status="running", now=now)


def finish_workflow(
    tx: Tx, parent: store.JobRow, status: str, *, now: int, result: str | None = None, error: str | None = None
) -> bool:
    """A running workflow parent → succeeded (*result*: its steps), failed (*error*) or cancelled."""
    seq = store.job_workflow_finish(tx.conn, parent.id, status, result, error, now)
    if seq is None:
        return False
    events.status_event(
        tx, job_id=parent.id, sequence=seq, status=status, now=now, **({"error": error} if error else {})
    )
    return True


# -- what a final status sets in motion -------------------------------------------------------------
_FINISHED_EVENT = {
    "succeeded": "job.completed",
    "failed": "job.failed",
    "cancelled": "job.cancelled",
    "interrupted": "job.interrupted",
}


def _finished(tx: Tx, attempt: Attempt, status: str, now: int) -> None:
    _tell(
        tx,
        _FINISHED_EVENT[status],
        attempt.job_id,
        attempt.kind,
        attempt.attempt,
        outcome=status,
        duration_s=attempt.elapsed_s(),
    )
    if attempt.parent_job_id is not None:
        _step_finished(tx, attempt.job_id, status, now)


def _stopped_running(tx: Tx, attempt: Attempt, now: int) -> None:
    """An execution stopped running: its concurrency key's slot comes back to what waits for it."""
    if attempt.concurrency_key is not None:
        admission.released(tx, queue=None, concurrency_key=attempt.concurrency_key, rate_key=None, now=now)


def _left_unstarted(tx: Tx, job: store.JobRow, now: int) -> None:
    """A queued job ended before it started: if it was admitted, its place in its queue's window and its
    keys' counts come back to what waits for them."""
    if job.held is None:
        admission.released(
            tx, queue=job.queue_name, concurrency_key=job.concurrency_key, rate_key=job.rate_key, now=now
        )


def _step_finished(tx: Tx, job_id: str, status: str, now: int) -> None:
    """Move the workflow of step *job_id* on, in the transaction that gave the step its final status.

    The parent row is locked first (``FOR UPDATE``; SQLite holds its write lock), so two steps finishing
    together cannot both miss that their common dependent became ready. A success releases the steps
    whose dependencies have all succeeded; the last success completes the workflow; a failure fails it
    at once and stops its other steps (fail-fast); a cancelled workflow ends once no step runs."""
    conn = tx.conn
    parent_id = store.job_workflow_parent_id(conn, job_id)
    if parent_id is None:
        return
    parent = store.job_get_for_update(conn, parent_id)
    if parent is None or parent.status != JobStatus.RUNNING or parent.worker_id != store.WORKFLOW_WORKER:
        return
    cancel_requested = parent.cancel_requested_at is not None
    if status == JobStatus.SUCCEEDED and not cancel_requested:
        for step in store.dependency_ready_dependents(conn, job_id):
            admission.admit(tx, HeldJob.of(step, run_after=now), now=now, delay_ms=0, waiting=(STEPS, parent_id))
    children = store.job_children(conn, parent_id)
    reused = dag.reused_steps(parent)
    if all(c.status == JobStatus.SUCCEEDED for c in children):
        steps = {**reused, **{dag.step_name(c): c.id for c in children}}
        finish_workflow(tx, parent, "succeeded", now=now, result=store.dumps({"steps": steps}))
        return
    store.job_workflow_progress(conn, parent_id, dag.aggregate_progress(children, len(reused)), now)
    if status != JobStatus.SUCCEEDED and not cancel_requested:
        step = next(c for c in children if c.id == job_id)
        error = f"step {dag.step_name(step)} {status}" + (f": {step.error}" if step.error else "")
        finish_workflow(tx, parent, "failed", now=now, error=error[:500])
        _stop_steps(tx, children, now)
    elif cancel_requested and all(c.status in TERMINAL_STATUSES for c in children):
        finish_workflow(tx, parent, "cancelled", now=now)


def _stop_steps(tx: Tx, children: Sequence[store.JobRow], now: int) -> None:
    """Cancel a workflow's queued steps and ask its running ones to stop (fail-fast, or its cancel)."""
    for child in children:
        if child.status == JobStatus.QUEUED:
            _cancel_queued(tx, child, now, {"reason": "workflow stopped"}, advance=False)
        elif child.status == JobStatus.RUNNING:
            request_cancel(tx, child, now=now, by="workflow")
