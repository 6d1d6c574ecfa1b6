"""``JobContext``: what a job's function gets to report progress, check for cancel and publish results.

Every write is conditional on this execution still being the job's current attempt (status
running, same attempt, same worker): a write that matches nothing changed nothing and raises
:class:`~jobs.errors.StaleAttempt`. ``result_transaction`` lets the function write its own domain
rows and the job's result in one transaction that takes the write lock before its first read
(``BEGIN IMMEDIATE`` on SQLite, ``SELECT … FOR UPDATE`` on PostgreSQL) and commits only if
``complete`` was called.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from . import dag, db, events, store, tracing
from .errors import JobCancelled, JobTimeout, StaleAttempt
from .execution.completer import InlineCompleter
from .group_commit import hot_write
from .transitions import Attempt

logger = logging.getLogger(__name__)

#: Event types only the job layer writes (an actor cannot forge a status change).
RESERVED_EVENT_TYPES = frozenset({"status", "cancel_requested"})

#: Progress of one attempt is written at most this often (the latest value wins; the keeper writes
#: what is left). A job reporting progress in a tight loop would otherwise make one write
#: transaction per call, and a short job's "done" line one more transaction right before its completion.
PROGRESS_INTERVAL_S = 0.25

# Phases of the actor thread, for the timeout: an asynchronous JobTimeout is raised only in USER.
_IDLE, _USER, _CRITICAL = 0, 1, 2


class ResultTransaction:
    """The open transaction of :meth:`JobContext.result_transaction`.

    Attributes:
      session: A SQLAlchemy Session for the function's domain rows (same transaction).
      connection: The Session's Connection, for Core statements.
    """

    def __init__(self, session: Session, connection: Connection) -> None:
        self.session = session
        self.connection = connection
        self._completed = False
        self._result: Any = None

    def complete(self, result: Any = None) -> None:
        """Publish *result* (JSON-serialisable) as the job's result when the block commits.

        Raises:
          TypeError: The result cannot be stored as JSON.
        """
        store.dumps(result)  # fail now, inside the block, rather than at commit
        self._completed = True
        self._result = result


class JobContext:
    """The running attempt of one job, given to the kind's function as its first argument.

    Attributes:
      job_id, owner_id, kind, attempt: Identity of this execution.
      config: Read-only snapshot of the settings taken when the job was submitted.
      payload: The job's payload (also passed as keyword arguments).
      resource: ``(type, id)`` or None.
    """

    def __init__(
        self,
        *,
        engine: Engine,
        broker: Any,
        job: store.JobRow,
        worker_id: str,
        lease_ttl_ms: int,
    ) -> None:
        import json

        self._engine = engine
        self._broker = broker
        self.job_id = job.id
        self.owner_id = job.owner_id
        self.kind = job.kind
        self.attempt = job.attempt
        self.max_attempts = job.max_attempts
        self.timeout_s = job.timeout_s
        self.worker_id = worker_id
        self.payload: dict[str, Any] = json.loads(job.payload)
        self.config: Mapping[str, Any] = MappingProxyType(json.loads(job.config))
        self.resource = (job.resource_type, job.resource_id) if job.resource_type is not None else None
        self.parent_job_id = job.parent_job_id
        self.lease_ttl_ms = lease_ttl_ms
        self.started_monotonic = time.monotonic()
        #: The identity every write of this attempt is fenced by.
        self.execution = Attempt.of(job, started_monotonic=self.started_monotonic)
        #: The message to settle a success with (set by the binding middleware on the SQLite broker).
        self.settle_with: Any = None
        self.deadline = self.started_monotonic + job.timeout_s
        self.completed = False
        self.finishing = False
        self.lost = False
        self.timed_out = False
        #: The keeper failed this attempt past its timeout while its thread ran on: it is still exiting.
        self.exiting = False
        self.outputs: list[Path] = []
        self._phase = _IDLE
        self._phase_lock = threading.Lock()
        self._thread_id: int | None = None
        self._fired = False
        self._in_result_transaction = False
        # Progress is written at most every PROGRESS_INTERVAL_S, counted from the claim (which showed
        # the job running): a report in between waits for the next write of this attempt or the keeper.
        self._progress_lock = threading.Lock()
        self._pending_progress: tuple[float | None, str | None] | None = None
        self._progress_due = self.started_monotonic + PROGRESS_INTERVAL_S

    # -- reporting --------------------------------------------------------------------------------
    def progress(self, fraction: float | None = None, message: str | None = None) -> None:
        """Record progress (``0 <= fraction <= 1``) and/or a short status line.

        Raises:
          StaleAttempt: This attempt is no longer current (nothing was written).
          ValueError: A fraction outside [0, 1].
        """
        if fraction is not None and not 0.0 <= fraction <= 1.0:
            raise ValueError(f"progress fraction must be within [0, 1], got {fraction}")
        self._not_inside_result_transaction("progress")

        with self._critical():
            with self._progress_lock:
                pending = self._pending_progress
                if pending is not None and fraction is None:
                    fraction = pending[0]  # a message-only update keeps the fraction still unwritten
                self._pending_progress = (fraction, message)
                due = time.monotonic() >= self._progress_due
            if due:
                if not self.flush_progress():
                    raise self._stale("progress")
                return
            # Written by the next write of this attempt or by the keeper within PROGRESS_INTERVAL_S;
            # the fence is checked now, so a superseded attempt still hears it at once.
            with db.fast_read(self._engine) as conn:
                current, _ = store.job_check_current(conn, self.job_id, self.attempt, self.worker_id)
            if not current:
                with self._progress_lock:
                    self._pending_progress = None
                raise self._stale("progress")

    def flush_progress(self) -> bool:
        """Write the progress not yet written (called by the actor's thread and by the keeper).

        Returns:
          False if this attempt is no longer current (nothing was written).
        """
        with self._progress_lock:
            # Left pending until written: a completion committing meanwhile takes it too (see
            # take_pending_progress), so the last report is never lost between the two writes.
            pending = self._pending_progress
            self._progress_due = time.monotonic() + PROGRESS_INTERVAL_S
        if pending is None:
            return True
        fraction, message = pending

        def write(tx: db.Tx) -> bool:
            now = store.now_ms()
            reused = dag.lock_workflow_of_step(tx.conn, self.parent_job_id)
            written = store.job_progress_if_current(
                tx.conn, self.job_id, self.attempt, self.worker_id, fraction, message, now
            )
            if written and reused is not None:
                dag.step_progressed(tx.conn, str(self.parent_job_id), reused, now)
            return written

        written = hot_write(self._engine, write)
        with self._progress_lock:
            if written and self._pending_progress is pending:
                self._pending_progress = None
        return written

    def take_pending_progress(self) -> tuple[float | None, str | None] | None:
        """The progress not yet written, handed to a write that records it itself (completion)."""
        with self._progress_lock:
            pending, self._pending_progress = self._pending_progress, None
        return pending

    def event(self, type: str, **data: Any) -> int:
        """Append an event to the job's log; returns its sequence number (per job, gap-free).

        Raises:
          StaleAttempt: This attempt is no longer current (nothing was written).
          TypeError: *data* is not JSON-serialisable.
          ValueError: *type* is one the job layer writes itself (``status``, ``cancel_requested``).
        """
        if type in RESERVED_EVENT_TYPES:
            raise ValueError(f"event type {type!r} is reserved for the job layer")
        self._not_inside_result_transaction("event")
        store.dumps(data)
        with self._critical():
            if not self.flush_progress():
                raise self._stale("event")

        def write(tx: db.Tx) -> int | None:
            seq = store.job_event_seq_next_if_current(tx.conn, self.job_id, self.attempt, self.worker_id)
            if seq is not None:
                events.record(tx, job_id=self.job_id, sequence=seq, type_=type, data=data, now=store.now_ms())
            return seq

        with self._critical():
            seq = hot_write(self._engine, write)
        if seq is None:
            raise self._stale("event")
        return seq

    def check_cancelled(self) -> None:
        """A checkpoint: stop here if a cancel was requested (or this attempt was superseded).

        Raises:
          JobCancelled: A cancel was requested.
          StaleAttempt: This attempt is no longer current.
        """
        with self._critical(), db.fast_read(self._engine) as conn:
            current, cancel = store.job_check_current(conn, self.job_id, self.attempt, self.worker_id)
        if not current:
            raise self._stale("check_cancelled")
        if cancel:
            raise JobCancelled()

    def output_path(self, name: str) -> Path:
        """A file path for an output of this attempt: ``<output_root>/<job>/<attempt>-<name>``.

        The directory is created. A failed attempt removes the files it declared; a retry writes
        to new names, so it never overwrites what an earlier attempt produced.

        Raises:
          ValueError: *name* is empty or contains a path separator.
        """
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            raise ValueError(f"output name must be a plain file name, got {name!r}")
        directory = Path(self.config.get("output_root", "var/outputs")) / self.job_id
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.attempt}-{name}"
        self.outputs.append(path)
        return path

    @contextmanager
    def result_transaction(self) -> Iterator[ResultTransaction]:
        """Write domain rows and the job's result atomically.

        ``with ctx.result_transaction() as tx: tx.session.add(...); tx.complete(result)``. The write
        lock is taken before the first read and this attempt is verified under it. The block commits
        only if ``tx.complete`` was called; leaving it otherwise, or by an exception, rolls back.

        Raises:
          StaleAttempt: This attempt is no longer current (on entry or at commit).
          JobCancelled: A cancel request committed first; nothing was written.
          JobTimeout: The attempt's time ran out before the commit.
        """
        span = tracing.span("tenure.job.result_transaction", self.job_id, self.kind, attempt=self.attempt)
        with span, self._result_transaction() as rtx:
            yield rtx

    @contextmanager
    def _result_transaction(self) -> Iterator[ResultTransaction]:
        with self._critical():
            if not self.flush_progress():
                raise self._stale("result_transaction")
        session = Session(self._engine, expire_on_commit=False)
        lock = db.writer_lock(self._engine)
        lock.acquire()
        try:
            with self._critical():
                session.begin()
                conn = session.connection()  # BEGIN IMMEDIATE (SQLite) happens here
                current, cancel = store.job_check_current_for_update(conn, self.job_id, self.attempt, self.worker_id)
            if not current:
                raise self._stale("result_transaction")
            if cancel:
                raise JobCancelled()
            rtx = ResultTransaction(session, conn)
            self._in_result_transaction = True
            try:
                yield rtx
            finally:
                self._in_result_transaction = False
            if not rtx._completed:
                session.rollback()
                return
            with self._critical():
                result_text = store.dumps(rtx._result)
                session.flush()
                self._check_declared_outputs(rtx._result)
                tx = db.session_tx(session)
                tx.broker = self._broker
                if not InlineCompleter.complete_in(tx, self.execution, result_text):
                    # cannot happen under the lock taken on entry; kept as the fence of last resort
                    raise self._stale("result_transaction commit")
                self.finishing = True
                session.commit()
                self.completed = True
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()
            lock.release()

    # -- internals ----------------------------------------------------------------------------------
    def _not_inside_result_transaction(self, what: str) -> None:
        # On SQLite the result transaction holds the only write lock: a second transaction from this
        # thread would wait for it until the busy timeout. Fail fast with the reason instead.
        if self._in_result_transaction:
            raise RuntimeError(f"ctx.{what}() cannot run inside result_transaction(); call it before or after")

    def _stale(self, what: str) -> StaleAttempt:
        self.lost = True
        logger.warning(
            "Stale %s from job %s attempt %d on %s: a newer attempt or a final status superseded it; "
            "nothing was written.",
            what,
            self.job_id,
            self.attempt,
            self.worker_id,
        )
        return StaleAttempt(f"job {self.job_id} attempt {self.attempt} is no longer current ({what} not written)")

    def _check_declared_outputs(self, result: Any) -> None:
        """A published result may reference only declared outputs that exist."""
        declared = {str(p) for p in self.outputs}
        missing: list[str] = []

        def walk(value: Any) -> None:
            if isinstance(value, str):
                if value in declared and not Path(value).exists():
                    missing.append(value)
            elif isinstance(value, dict):
                for v in value.values():
                    walk(v)
            elif isinstance(value, list | tuple):
                for v in value:
                    walk(v)

        walk(result)
        if missing:
            raise FileNotFoundError(f"the result references outputs that were not written: {', '.join(missing)}")

    def _remove_outputs(self) -> None:
        for path in self.outputs:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                logger.warning("Could not remove output %s of a failed attempt.", path, exc_info=True)

    def _arm(self) -> None:
        with self._phase_lock:
            self._thread_id = threading.get_ident()
            self._phase = _USER

    def _disarm(self) -> None:
        """Leave user code: from here on no asynchronous timeout is raised in this thread."""
        with self._phase_lock:
            self._phase = _IDLE
            fired = self._fired
        if fired:
            _absorb_pending_interrupt()

    @contextmanager
    def _critical(self) -> Iterator[None]:
        """A section the timeout must not interrupt (the job layer's own database work, so a
        connection is never abandoned half-way through a statement); refuses to start past the deadline."""
        with self._phase_lock:
            previous = self._phase
            refuse = previous == _USER and (self._fired or time.monotonic() >= self.deadline)
            if refuse:
                self.timed_out = True
            else:
                self._phase = _CRITICAL
        if refuse:
            if self._fired:
                _absorb_pending_interrupt()
            raise JobTimeout()
        try:
            yield
        finally:
            with self._phase_lock:
                self._phase = previous

    def _interrupt_if_overdue(self, now_monotonic: float) -> bool:
        """Called by the keeper thread: interrupt the actor thread if it is in user code past its deadline."""
        with self._phase_lock:
            if self._phase != _USER or now_monotonic < self.deadline or self._thread_id is None or self._fired:
                return False
            self.timed_out = True
            self._fired = True
            _raise_async_exception(self._thread_id, TimeoutInterrupt)
            return True


class TimeoutInterrupt(BaseException):
    """Raised asynchronously in an actor thread that ran past its job's timeout.

    A BaseException, like Dramatiq's ``TimeLimitExceeded``, so ``except Exception`` in user code
    does not swallow it.
    """


def _noop() -> None:
    pass


def _absorb_pending_interrupt() -> None:
    """Let an interrupt the keeper already scheduled for this thread fire here, harmlessly.

    CPython delivers an asynchronous exception at the thread's next check of its eval breaker (a
    call or a loop jump), so a short loop of calls receives it. Clearing it with
    ``PyThreadState_SetAsyncExc(id, NULL)`` instead would leave CPython's async-exception signal
    set, slowing every thread of the interpreter from then on.
    """
    try:
        for _ in range(10_000):
            _noop()
    except TimeoutInterrupt:
        pass


def _raise_async_exception(thread_id: int, exc_type: type[BaseException]) -> None:
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc_type))
