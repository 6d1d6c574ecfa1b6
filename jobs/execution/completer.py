"""Recording how an attempt ended: the one way an execution finishes a job, however it is batched.

River's ``JobCompleter`` shape: one interface, :class:`Completer`, and two implementations in front
of the same transitions (:mod:`jobs.transitions`):

- :class:`InlineCompleter` writes the outcome in a transaction of its own (group-committed with the
  process's other hot-path writes on SQLite, :func:`jobs.group_commit.hot_write`), or inside a
  transaction the actor already holds (:meth:`InlineCompleter.complete_in`, for ``result_transaction``);
- :class:`BatchCompleter` (the SQLite broker on the job file) records a success in the transaction
  that acks the job's message: the broker group-commits acks, so the success costs no transaction and
  no wait of its own, and the successes of one ack batch are one UPDATE (:func:`transitions.complete_many`).
  A crash before that commit leaves both undone: the message comes back after its lease and the
  recovery rules apply, exactly as for a crash a moment earlier. Other outcomes, and workflow steps
  (whose success moves their workflow on), go inline.

Whatever the path, a success whose guard fails because a cancel request committed first ends the job
``cancelled``; an attempt that is no longer current writes nothing (``stale``).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from dramatiq.errors import ConnectionClosed
from sqlalchemy.exc import OperationalError

from .. import attempts, db, store, tracing, transitions
from ..group_commit import Together, hot_write
from ..lifecycle import AfterCommitBuffer, lifecycle
from ..publish import prepare_broker
from ..transitions import Attempt
from .worker import WorkerState

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How many times an outcome write is retried while the database is unavailable.
WRITE_RETRIES = 20
#: Longest pause between those retries, in seconds.
WRITE_RETRY_MAX_S = 2.0
#: The error of an attempt that ran out of time.
TIMED_OUT = "Job timed out."


@dataclass(frozen=True)
class Succeeded:
    #: The result as stored (JSON text).
    result: str | None


@dataclass(frozen=True)
class Failed:
    error: str


@dataclass(frozen=True)
class Retry:
    """Failed, with attempts left: queue the next one after *delay_s*."""

    error: str
    delay_s: float


@dataclass(frozen=True)
class Cancelled:
    """The execution honoured a cancel request."""


Outcome = Succeeded | Failed | Retry | Cancelled

#: What :meth:`Completer.finish` reports: the job's new status, ``retrying``, ``stale`` (nothing
#: written: a newer attempt or a final status superseded this one) or ``deferred`` (recorded with the
#: message's ack, see :class:`BatchCompleter`).
Final = str


class Finishing(Protocol):
    """What a completer needs of the attempt it finishes (a :class:`jobs.context.JobContext`)."""

    execution: Attempt
    #: The message to settle the success with (SQLite broker on the job file), else None.
    settle_with: Any
    completed: bool

    def take_pending_progress(self) -> tuple[float | None, str | None] | None: ...

    def _stale(self, what: str) -> Exception: ...


class Completer(Protocol):
    def finish(self, ctx: Finishing, outcome: Outcome, *, broker: Any) -> Final: ...


def retrying(what: str, fn: Callable[[], T]) -> T:
    """Run a write, retrying while the database is unavailable (locked, restarting)."""
    delay = 0.05
    for attempt in range(WRITE_RETRIES):
        try:
            return fn()
        except (OperationalError, sqlite3.OperationalError, ConnectionClosed) as e:
            if attempt == WRITE_RETRIES - 1:
                raise
            logger.warning("%s failed (%s); retrying in %.2fs.", what, e, delay)
            time.sleep(delay)
            delay = min(WRITE_RETRY_MAX_S, delay * 2)
    raise AssertionError("unreachable")


def _settle(tx: db.Tx, attempt: Attempt, outcome: Outcome, now: int, message: str | None) -> Final:
    """*outcome* of *attempt* inside *tx*: the transitions, in the order the guards decide."""
    if isinstance(outcome, Succeeded):
        if transitions.complete(tx, attempt, outcome.result, now=now, progress_message=message):
            return "succeeded"
        outcome = Cancelled()  # not completed: a cancel request committed first, or stale
    current, cancel = store.job_check_current_for_update(tx.conn, attempt.job_id, attempt.attempt, attempt.worker_id)
    if not current:
        return "stale"
    if cancel or isinstance(outcome, Cancelled):
        transitions.cancel_running(tx, attempt, now=now)
        return "cancelled"
    if isinstance(outcome, Retry) and transitions.requeue_for_retry(
        tx, attempt, outcome.error, delay_s=outcome.delay_s, now=now
    ):
        return "retrying"
    ended = attempts.TIMED_OUT if outcome.error == TIMED_OUT else attempts.FAILED
    transitions.fail(tx, attempt, outcome.error, now=now, outcome=ended)
    return "failed"


class InlineCompleter:
    """Each outcome in a write transaction of its own (see the module docstring)."""

    def __init__(self, worker: WorkerState) -> None:
        self.worker = worker

    def finish(self, ctx: Finishing, outcome: Outcome, *, broker: Any) -> Final:
        attempt = ctx.execution
        pending = ctx.take_pending_progress()
        message = None if pending is None else pending[1]

        def write(tx: db.Tx) -> Final:
            tx.broker = broker
            return _settle(tx, attempt, outcome, store.now_ms(), message)

        if isinstance(outcome, Succeeded) and attempt.parent_job_id is None:
            # The hot path: a plain job's success, group-committed with the others of its batch.
            together = Together(_successes_together, (attempt, outcome.result, message, broker))
            return retrying(
                f"Recording the outcome of job {attempt.job_id}",
                lambda: hot_write(self.worker.engine, write, together),
            )
        if broker is not None:
            prepare_broker(broker)  # before the transaction: a retry may enqueue on it

        def inline() -> Final:
            with db.write(self.worker.engine) as tx:
                return write(tx)

        return retrying(f"Recording the outcome of job {attempt.job_id}", inline)

    @staticmethod
    def complete_in(tx: db.Tx, attempt: Attempt, result: str | None) -> bool:
        """running → succeeded inside the caller's open transaction (``result_transaction``)."""
        return transitions.complete(tx, attempt, result, now=store.now_ms())


class BatchCompleter:
    """Successes of plain jobs settle with their message's ack; everything else goes inline."""

    def __init__(self, worker: WorkerState) -> None:
        self.inline = InlineCompleter(worker)

    def finish(self, ctx: Finishing, outcome: Outcome, *, broker: Any) -> Final:
        message = ctx.settle_with
        if not isinstance(outcome, Succeeded) or ctx.execution.parent_job_id is not None or message is None:
            return self.inline.finish(ctx, outcome, broker=broker)
        pending = ctx.take_pending_progress()
        message.in_ack_transaction(_AckCompletion(ctx, outcome.result, None if pending is None else pending[1]))
        return "deferred"


def _succeed_many(txs: list[db.Tx], successes: list[tuple[Attempt, str | None, str | None]]) -> list[Final]:
    """Successes ``(attempt, result, progress message)`` in one UPDATE and one INSERT of their status events;
    an attempt that matched nothing (a cancel request first, or stale) is settled alone."""
    now = store.now_ms()
    done = transitions.complete_many(txs, successes, now=now)
    return [
        "succeeded" if ok else _settle(tx, attempt, Succeeded(result), now, message)
        for tx, (attempt, result, message), ok in zip(txs, successes, done, strict=True)
    ]


def _successes_together(txs: list[db.Tx], items: list[tuple[Attempt, str | None, str | None, Any]]) -> list[Final]:
    """The successes of one group-committed batch (:class:`InlineCompleter`)."""
    for tx, (_, _, _, broker) in zip(txs, items, strict=True):
        tx.broker = broker
    return _succeed_many(txs, [(attempt, result, message) for attempt, result, message, _ in items])


def _complete_batch(conn: sqlite3.Connection, completions: list[_AckCompletion]) -> list[Callable[[], None]]:
    """The successes of one ack batch (:class:`BatchCompleter`)."""
    txs = [c.tx(conn) for c in completions]
    finals = _succeed_many(txs, [(c.ctx.execution, c.result, c.message) for c in completions])
    return [c.after(final) for c, final in zip(completions, finals, strict=True)]


class _AckCompletion:
    """One success recorded in its message's ack transaction: ``completion(conn)`` alone, or with the
    others of its ack batch through :func:`_complete_batch` (the ``batch`` attribute)."""

    __slots__ = ("ctx", "result", "message", "pending", "span")

    def __init__(self, ctx: Finishing, result: str | None, message: str | None) -> None:
        self.ctx = ctx
        self.result = result
        self.message = message
        self.pending = AfterCommitBuffer()
        a = ctx.execution
        # From the hand-off to the ack writer until the ack batch holding the success committed.
        self.span = tracing.start("tenure.job.commit", a.job_id, a.kind, a.attempt)

    def tx(self, conn: sqlite3.Connection) -> db.Tx:
        self.pending = AfterCommitBuffer()  # a batch run again (database unavailable) starts afresh
        return db.Tx(conn, self.pending)  # type: ignore[arg-type]

    def __call__(self, conn: sqlite3.Connection) -> Callable[[], None]:
        final = _settle(self.tx(conn), self.ctx.execution, Succeeded(self.result), store.now_ms(), self.message)
        return self.after(final)

    def after(self, final: Final) -> Callable[[], None]:
        """What runs once the ack batch committed: the transitions' after-commit work, then the attempt's state."""
        ctx, pending, span = self.ctx, self.pending, self.span

        def run() -> None:
            if span is not None:
                span.set_attribute("tenure.job.final", final)
                span.end()
            pending.run()
            if final == "stale":
                ctx._stale("outcome ok")
                a = ctx.execution
                lifecycle("job.stale_write", a.job_id, a.kind, a.attempt, outcome="stale")
            ctx.completed = final == "succeeded"

        return run

    batch = staticmethod(_complete_batch)
