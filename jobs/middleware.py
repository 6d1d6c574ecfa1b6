"""Binding Dramatiq messages to job records: :class:`JobMiddleware` and the job actors' body.

For a message that carries a job id (see :mod:`jobs.publish`):

1. ``before_process_message`` claims the job in one guarded UPDATE (queued → running,
   ``attempt + 1``, this worker, a fresh lease). If that matches nothing — cancelled, terminal,
   running under a live lease, a duplicate delivery — the message is skipped and acked. A message
   for a kind this worker cannot run ends its job ``failed`` ("no handler for kind X").
2. The actor (declared by :mod:`jobs.registry`) runs the kind's function with a
   :class:`~jobs.context.JobContext` and records the outcome itself, so Dramatiq's ``Retries``
   never sees an exception: return → succeeded; :class:`JobCancelled` → cancelled; other errors →
   the job's own retry policy (same job, next attempt after a backoff, its message re-enqueued in the
   same transaction as the status change) or failed; timeout → failed "Job timed out.".
3. A keeper thread renews the leases of running jobs every third of the TTL, interrupts overdue
   attempts, and recovers expired jobs periodically (:mod:`jobs.recovery`).
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from dramatiq.broker import Broker
from dramatiq.errors import ConnectionClosed
from dramatiq.middleware import Middleware, SkipMessage
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from settings.environment import Settings, current_settings

from . import db, events, store
from .context import PROGRESS_INTERVAL_S, JobContext, TimeoutInterrupt
from .errors import JobCancelled, JobTimeout, StaleAttempt, public_error
from .group_commit import hot_write
from .notify import NoticeBuffer
from .publish import JOB_ID_OPTION, prepare_broker, publish_in_transaction, same_sqlite_file
from .recovery import RecoveryReport, recover_expired, recover_in
from .registry import Kind, Registry
from .registry import registry as default_registry
from .schema import check_database_at_head

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How many times an outcome write is retried while the database is unavailable.
WRITE_RETRIES = 20
#: Longest pause between those retries, in seconds.
WRITE_RETRY_MAX_S = 2.0
TIMED_OUT = "Job timed out."

_local = threading.local()
#: "No deferred completion" (None is a valid result).
_NOTHING = object()


class _Process:
    """This process's id, refreshed after a fork (read on every message: cheaper than a syscall)."""

    pid = os.getpid()

    @classmethod
    def refresh(cls) -> None:
        cls.pid = os.getpid()


_process = _Process
os.register_at_fork(after_in_child=_Process.refresh)


#: Structured lifecycle lines (no payloads, no results, no secrets): monitoring formats them and turns
#: them into metrics; the job layer cannot import monitoring, so it speaks plain logging.
lifecycle_logger = logging.getLogger("tenure.lifecycle")


#: Callables told of every lifecycle event (its fields, as logged): monitoring counts its metrics
#: here, so counting does not depend on the log level.
lifecycle_observers: list[Callable[[dict[str, Any]], None]] = []
#: Events logged at DEBUG: one line per started and per succeeded job doubled the CPU cost of a short
#: job (a log record through Dramatiq's log pipe costs more than the job's own database writes);
#: failures, retries, cancellations and stale writes stay at INFO.
QUIET_EVENTS = frozenset({"job.started", "job.completed"})
#: Marks a record whose event the observers already saw (so a log handler does not count it twice).
OBSERVED = "tenure_observed"


def lifecycle(
    event: str, job_id: str, kind: str, attempt: int, *, outcome: str | None = None, duration_s: float | None = None
) -> None:
    level = logging.DEBUG if event in QUIET_EVENTS else logging.INFO
    observers = lifecycle_observers
    logged = lifecycle_logger.isEnabledFor(level)
    if not observers and not logged:
        return
    fields: dict[str, Any] = {"event": event, "job_id": job_id, "kind": kind, "attempt": attempt}
    if outcome is not None:
        fields["outcome"] = outcome
    if duration_s is not None:
        fields["duration_s"] = round(duration_s, 6)
    for observe in observers:
        try:
            observe(fields)
        except Exception:
            logger.exception("A lifecycle observer failed on %s.", event)
    if logged:
        lifecycle_logger.log(
            level,
            "%s job=%s kind=%s attempt=%d",
            event,
            job_id,
            kind,
            attempt,
            extra={"tenure": fields, OBSERVED: bool(observers)},
        )


def _elapsed(ctx: JobContext) -> float | None:
    """Seconds since *ctx*'s claim (None for a context not made by a claim)."""
    started = getattr(ctx, "_started_monotonic", None)
    return None if started is None else time.monotonic() - started


def current_job() -> JobContext | None:
    """The JobContext of the job running in this thread, if any."""
    return getattr(_local, "ctx", None)


def _retrying(what: str, fn: Callable[[], T]) -> T:
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


class JobMiddleware(Middleware):
    """Claims, heartbeats and recovery for job messages.

    Parameters:
      settings: Lease TTL, recovery interval, database URL (default: this process's settings).
      engine: The job database (default: one made from ``settings.database_url`` in each process).
      registry: The kinds this worker can run (default: :data:`jobs.registry.registry`).
      check_schema: Refuse to boot a worker against a database not at the head revision.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        engine: Engine | None = None,
        registry: Registry | None = None,
        check_schema: bool = True,
    ) -> None:
        self.settings = settings or current_settings()
        self.registry = registry or default_registry
        self.check_schema = check_schema
        self.lease_ttl_ms = int(self.settings.job_lease_ttl_s * 1000)
        self._given_engine = engine
        self._engine: Engine | None = None
        self._pid = -1
        self._worker_id = ""
        self._lock = threading.Lock()
        self._running: dict[int, JobContext] = {}
        self._keeper: _Keeper | None = None
        self._broker: Broker | None = None
        self._ack_file_cache: dict[int, bool] = {}

    # -- per-process state --------------------------------------------------------------------------
    def _ensure_process(self) -> None:
        if self._pid == _process.pid:
            return
        with self._lock:
            if self._pid == _process.pid:
                return
            if self._given_engine is not None:
                self._engine = self._given_engine
            else:
                self._engine = db.make_engine(
                    self.settings.database_url, busy_timeout_ms=self.settings.sqlite_busy_timeout_ms
                )
            self._worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
            self._running = {}
            self._keeper = None
            self._pid = _process.pid

    @property
    def engine(self) -> Engine:
        self._ensure_process()
        assert self._engine is not None
        return self._engine

    @property
    def worker_id(self) -> str:
        self._ensure_process()
        return self._worker_id

    def _track(self, ctx: JobContext) -> None:
        """Heartbeat and time *ctx* while it runs."""
        with self._lock:
            self._running[id(ctx)] = ctx

    def _untrack(self, ctx: JobContext) -> None:
        with self._lock:
            self._running.pop(id(ctx), None)

    def running(self) -> list[JobContext]:
        with self._lock:
            return list(self._running.values())

    def _start_keeper(self, broker: Broker) -> None:
        self._ensure_process()
        with self._lock:
            self._broker = broker
            if self._keeper is None:
                self._keeper = _Keeper(self, broker)

    # -- worker lifecycle -------------------------------------------------------------------------
    def before_worker_boot(self, broker: Broker, worker: Any) -> None:
        if self.check_schema:
            try:
                check_database_at_head(self.engine)
            except Exception as e:
                logger.critical("%s", e)
                # SystemExit passes through Dramatiq's emit_before (it only logs Exceptions) and
                # stops the process before any consumer touches the database.
                raise SystemExit(f"tenure worker refused to start: {e}") from e

    def after_worker_boot(self, broker: Broker, worker: Any) -> None:
        self._start_keeper(broker)
        try:
            recover_expired(self.engine, broker=broker)
        except Exception:
            logger.exception("Recovery at worker start failed; the keeper retries it.")

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        # After the worker threads were joined: jobs still finishing during shutdown keep their leases.
        self.stop()

    def stop(self) -> None:
        """Stop the keeper thread (lease renewal, timeouts, recovery) of this process."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()

    # -- messages --------------------------------------------------------------------------------
    def before_process_message(self, broker: Broker, message: Any) -> None:
        _local.ctx = None
        job_id = message.options.get(JOB_ID_OPTION)
        if job_id is None:
            return
        try:
            self._start_keeper(broker)
            kind = self.registry.find(message.actor_name)
            if kind is None or message.actor_name not in broker.actors:
                _retrying(f"Failing job {job_id}", lambda: self._fail_unknown(job_id, message.actor_name))
                raise SkipMessage(f"no handler for kind {message.actor_name}")
            ctx = _retrying(f"Claim of job {job_id}", lambda: self._claim(broker, job_id, message.queue_name))
        except SkipMessage:
            raise
        except Exception:
            # Dramatiq would log this and run the actor anyway; without a claim it must not run.
            # Failing the message dead-letters it, and a replay is safe (the claim is guarded).
            logger.exception("Could not claim job %s; its message is dead-lettered for replay.", job_id)
            message.fail()
            return
        if ctx is None:
            raise SkipMessage(f"job {job_id} is not claimable (duplicate, cancelled, finished or running elsewhere)")
        if self._acks_in_job_file(broker) and hasattr(message, "in_ack_transaction"):
            ctx._settle_with = message  # type: ignore[attr-defined]
        _local.ctx = ctx

    def before_nack(self, broker: Broker, message: Any) -> None:
        # Dramatiq's consumer thread dead-letters a message for an actor this process does not
        # declare before any process_message hook runs; its job must end failed, not wait forever.
        job_id = message.options.get(JOB_ID_OPTION)
        if job_id is not None and message.actor_name not in broker.actors:
            try:
                _retrying(f"Failing job {job_id}", lambda: self._fail_unknown(job_id, message.actor_name))
            except Exception:
                logger.exception("Could not fail job %s of unknown kind %s.", job_id, message.actor_name)

    def after_process_message(self, broker: Broker, message: Any, *, result: Any = None, exception: Any = None) -> None:
        ctx = getattr(_local, "ctx", None)
        if ctx is not None and getattr(ctx, "_deferred", _NOTHING) is not _NOTHING:
            message.in_ack_transaction(self._completion_hook(ctx, ctx._deferred))
        self._release()

    def _acks_in_job_file(self, broker: Broker) -> bool:
        """Whether *broker*'s acks commit in the job database (a SQLiteBroker on the same file)."""
        same = self._ack_file_cache.get(id(broker))
        if same is None:
            same = False
            if db.fast_sqlite(self.engine):
                with self.engine.connect() as conn:
                    same = same_sqlite_file(conn, broker)
            self._ack_file_cache[id(broker)] = same
        return same

    def after_skip_message(self, broker: Broker, message: Any) -> None:
        self._release()

    def _release(self) -> None:
        ctx = getattr(_local, "ctx", None)
        if ctx is None:
            return
        _local.ctx = None

    def _claim(self, broker: Broker, job_id: str, queue_name: str | None = None) -> JobContext | None:
        if self._broker is None:
            self._broker = broker
        prepare_broker(broker)
        worker_id, lease_ttl_ms = self.worker_id, self.lease_ttl_ms

        def claim(tx: db.Tx) -> store.JobRow | None:
            now = store.now_ms()
            job = store.job_claim(tx.conn, job_id, worker_id, now, lease_ttl_ms)
            if job is not None:
                events.status_event(
                    tx,
                    job_id=job.id,
                    owner_id=job.owner_id,
                    sequence=job.event_seq,
                    status="running",
                    now=now,
                    attempt=job.attempt,
                )
            return job

        if queue_name is not None and self._acks_in_job_file(broker):
            # The broker's ack writer commits this process's acks (and job completions, see
            # _completion_hook) in batches on the same file: the claim joins its next batch, in one
            # statement with the other claims of that batch (_claim_batch).
            request = _ClaimRequest(job_id, claim)
            job = broker.write_with_acks(queue_name, request, batch=self._claim_batch)  # type: ignore[attr-defined]
            request.notices.deliver()
        else:
            job = hot_write(self.engine, claim)
        if job is None:
            with db.write(self.engine) as tx:
                # Maybe it is running under an expired lease but not claimable (unsafe kind, cancel
                # requested, last attempt): settle it now rather than at the next recovery.
                recover_in(tx, broker, store.now_ms(), limit=1, job_id=job_id)
            return None
        ctx = JobContext(
            engine=self.engine, broker=broker, job=job, worker_id=self.worker_id, lease_ttl_ms=self.lease_ttl_ms
        )
        ctx._kind = self.registry.find(job.kind)  # type: ignore[attr-defined]
        ctx._started_monotonic = time.monotonic()  # type: ignore[attr-defined]
        lifecycle("job.started", ctx.job_id, job.kind, ctx.attempt)
        return ctx

    def _claim_batch(self, conn: sqlite3.Connection, requests: list[_ClaimRequest]) -> list[store.JobRow | None]:
        """The claims of one ack batch (SQLite broker on the job file) in one UPDATE and one INSERT of
        their status events: what each ``_claim`` would write alone, at a fraction of the statements."""
        now = store.now_ms()
        for request in requests:
            request.notices = NoticeBuffer()  # a batch run again (database unavailable) starts afresh
        claimed = store.job_claim_many(conn, [r.job_id for r in requests], self.worker_id, now, self.lease_ttl_ms)
        jobs: list[store.JobRow | None] = []
        entries = []
        for request in requests:
            job = claimed.pop(request.job_id, None)  # a duplicate delivery in the same batch gets nothing
            jobs.append(job)
            if job is not None:
                entries.append((job.id, job.owner_id, job.event_seq, "running", {"attempt": job.attempt}))
        notices = iter(events.status_events_many(conn, now, entries))
        for request, job in zip(requests, jobs, strict=True):
            if job is not None:
                request.notices.add(next(notices))
        return jobs

    def _fail_unknown(self, job_id: str, kind: str) -> None:
        error = f"no handler for kind {kind}"

        logger.error("Job %s: %s on this worker; the job is failed.", job_id, error)
        with db.write(self.engine) as tx:
            now = store.now_ms()
            job = store.job_get(tx.conn, job_id)
            seq = store.job_fail_queued(tx.conn, job_id, error, now)
            if seq is not None and job is not None:
                events.status_event(
                    tx, job_id=job_id, owner_id=job.owner_id, sequence=seq, status="failed", now=now, error=error
                )

    # -- outcomes (called in the actor thread) ---------------------------------------------------
    def finish(self, ctx: JobContext, kind: Kind, outcome: str, value: Any = None) -> None:
        """Record the outcome of an attempt: ``ok`` (value), ``cancelled``, ``timeout`` or ``error`` (exc)."""
        if ctx.lost and outcome != "ok":
            return
        ctx.finishing = True
        try:
            _retrying(f"Recording the outcome of job {ctx.job_id}", lambda: self._finish(ctx, kind, outcome, value))
            status = getattr(ctx, "_final_status", None)
            if status is not None:
                event = {"succeeded": "job.completed", "retrying": "job.retrying"}.get(status, f"job.{status}")
                lifecycle(event, ctx.job_id, kind.name, ctx.attempt, outcome=status, duration_s=_elapsed(ctx))
        except StaleAttempt:
            lifecycle("job.stale_write", ctx.job_id, kind.name, ctx.attempt, outcome="stale")
        except Exception:
            logger.exception(
                "Could not record the outcome of job %s attempt %d; recovery will handle it when its lease expires.",
                ctx.job_id,
                ctx.attempt,
            )
        if outcome != "ok":
            ctx._remove_outputs()

    def _finish(self, ctx: JobContext, kind: Kind, outcome: str, value: Any) -> None:
        if outcome == "ok" and ctx.parent_job_id is None:
            if getattr(ctx, "_settle_with", None) is not None:
                # Completed in the transaction that acks the message (see _completion_hook).
                ctx._deferred = value  # type: ignore[attr-defined]
                return
            if self._complete_fast(ctx, value):
                return
        elif not ctx.flush_progress():
            raise ctx._stale(f"outcome {outcome}")
        broker = self._broker
        if outcome == "error" and broker is not None:
            prepare_broker(broker)
        with db.write(self.engine) as tx:
            tx.broker = broker
            conn = tx.conn
            now = store.now_ms()
            if outcome == "ok":
                if ctx._record_success(tx, value, now):
                    ctx.completed = True
                    ctx._final_status = "succeeded"  # type: ignore[attr-defined]
                    return
                # Not completed: either superseded (stale) or a cancel request committed first.
                outcome = "cancelled"
            current, cancel = store.job_check_current_for_update(conn, ctx.job_id, ctx.attempt, ctx.worker_id)
            if not current:
                raise ctx._stale(f"outcome {outcome}")
            if outcome == "cancelled" or cancel:
                status, error = "cancelled", None
            elif outcome == "timeout":
                status, error = "failed", TIMED_OUT
            else:
                exc: BaseException = value
                error = public_error(exc)
                retry = not isinstance(exc, kind.never_retry) and ctx.attempt < ctx.max_attempts
                if retry and broker is not None:
                    delay_s = max(0.0, float(kind.backoff(ctx.attempt)))
                    job = store.job_get(conn, ctx.job_id)
                    assert job is not None
                    seq = store.job_requeue_for_retry(
                        conn, ctx.job_id, ctx.attempt, ctx.worker_id, error, now + int(delay_s * 1000), now
                    )
                    if seq is not None:
                        events.status_event(
                            tx,
                            job_id=ctx.job_id,
                            owner_id=ctx.owner_id,
                            sequence=seq,
                            status="queued",
                            now=now,
                            attempt=ctx.attempt,
                            error=error,
                            retry_in_s=round(delay_s, 3),
                        )
                        publish_in_transaction(
                            conn,
                            broker,
                            job_id=ctx.job_id,
                            actor_name=job.actor_name,
                            queue_name=job.queue_name,
                            priority=job.priority,
                            delay_ms=int(delay_s * 1000),
                            now=now,
                        )
                        ctx._final_status = "retrying"  # type: ignore[attr-defined]
                        return
                status = "failed"
            seq = store.job_finish_if_current(conn, ctx.job_id, ctx.attempt, ctx.worker_id, status, error, now)
            if seq is None:
                raise ctx._stale(f"outcome {status}")
            data: dict[str, Any] = {"attempt": ctx.attempt}
            if error:
                data["error"] = error
            events.status_event(
                tx, job_id=ctx.job_id, owner_id=ctx.owner_id, sequence=seq, status=status, now=now, **data
            )
            ctx._final_status = status  # type: ignore[attr-defined]

    def _completion_hook(self, ctx: JobContext, value: Any) -> _Completion:
        """The completion of *ctx* as a hook of its message's ack (SQLite broker on the job file).

        A job that returned is recorded ``succeeded`` in the same transaction that acks its message:
        the broker group-commits acks, so the completion costs no transaction and no wait of its own,
        and a crash before that commit leaves both undone — the message comes back after its lease
        and the job's recovery rules apply, exactly as for a crash a moment earlier. A cancel request
        that committed first makes it ``cancelled``; a superseded attempt writes nothing. The
        completions of one ack batch are written together (:meth:`_complete_batch`).
        """
        pending = ctx.take_pending_progress()
        return _Completion(ctx, value, None if pending is None else pending[1], self._complete_batch)

    def _complete_batch(self, conn: sqlite3.Connection, completions: list[_Completion]) -> list[Callable[[], None]]:
        """The completions of one ack batch in one UPDATE and one INSERT of their status events (what
        :meth:`JobContext._record_success` writes for each); an attempt that matched nothing (stale, or
        cancelled first) goes on alone (:meth:`_Completion.not_completed`)."""
        now = store.now_ms()
        for c in completions:
            c.notices = NoticeBuffer()  # a batch run again (database unavailable) starts afresh
        completed = store.job_complete_many(
            conn, [(c.ctx.job_id, c.ctx.attempt, c.ctx.worker_id, c.value, c.message) for c in completions], now
        )
        entries = []
        done: list[_Completion] = []
        afters: list[Callable[[], None]] = []
        for c in completions:
            seq = completed.pop(c.ctx.job_id, None)
            if seq is None:
                afters.append(c.not_completed(conn, now))
                continue
            entries.append((c.ctx.job_id, c.ctx.owner_id, seq, "succeeded", {"attempt": c.ctx.attempt}))
            done.append(c)
            afters.append(c.after_commit("succeeded"))
        for c, notice in zip(done, events.status_events_many(conn, now, entries), strict=True):
            c.notices.add(notice)
        return afters

    def _complete_fast(self, ctx: JobContext, value: Any) -> bool:
        """running → succeeded on the hot path (a job that is no workflow step); False when the
        guard matched nothing (stale, or a cancel request committed first): the caller decides."""

        pending = ctx.take_pending_progress()
        message = None if pending is None else pending[1]

        def complete(tx: db.Tx) -> bool:
            return ctx._record_success(tx, value, store.now_ms(), message=message, workflow_step=False)

        if not hot_write(self.engine, complete):
            return False
        ctx.completed = True
        ctx._final_status = "succeeded"  # type: ignore[attr-defined]
        return True

    # -- keeper work -------------------------------------------------------------------------------
    def flush_progress(self) -> None:
        """Write the progress running attempts reported since their last write."""
        for ctx in self.running():
            if ctx.lost or ctx.completed or ctx.finishing:
                continue
            try:
                if not ctx.flush_progress() and not (ctx.finishing or ctx.completed):
                    ctx.lost = True
                    logger.warning(
                        "Job %s attempt %d lost its lease; its progress was not written.", ctx.job_id, ctx.attempt
                    )
            except Exception:
                logger.exception("Writing the progress of job %s failed; the next report retries.", ctx.job_id)

    def renew_leases(self) -> None:
        contexts = self.running()
        if not contexts:
            return
        lost: list[JobContext] = []
        with db.write(self.engine) as tx:
            expires = store.now_ms() + self.lease_ttl_ms
            for ctx in contexts:
                if ctx.lost or ctx.completed:
                    continue
                if not store.job_lease_renew_if_current(tx.conn, ctx.job_id, ctx.attempt, ctx.worker_id, expires):
                    lost.append(ctx)
        for ctx in lost:
            if ctx.finishing or ctx.completed:
                continue  # its outcome is being (or was just) recorded: not a lost lease
            ctx.lost = True
            logger.warning(
                "Job %s attempt %d lost its lease (taken over or finished elsewhere); its writes are fenced.",
                ctx.job_id,
                ctx.attempt,
            )

    def enforce_timeouts(self) -> None:
        now = time.monotonic()
        grace_s = self.settings.job_lease_ttl_s
        for ctx in self.running():
            if ctx.completed or ctx.lost or now < ctx.deadline:
                continue
            if ctx._interrupt_if_overdue(now):
                logger.warning("Job %s attempt %d timed out; interrupting it.", ctx.job_id, ctx.attempt)
            elif now >= ctx.deadline + grace_s:
                # The thread did not respond (stuck in C code): fail the attempt in the database; the
                # guard fences whatever the thread writes later.
                self._fail_overdue(ctx)

    def _fail_overdue(self, ctx: JobContext) -> None:
        with db.write(self.engine) as tx:
            now = store.now_ms()
            seq = store.job_fail_if_current(tx.conn, ctx.job_id, ctx.attempt, ctx.worker_id, TIMED_OUT, now)
            if seq is not None:
                events.status_event(
                    tx,
                    job_id=ctx.job_id,
                    owner_id=ctx.owner_id,
                    sequence=seq,
                    status="failed",
                    now=now,
                    attempt=ctx.attempt,
                    error=TIMED_OUT,
                )
        ctx.lost = True
        logger.error("Job %s attempt %d did not stop after its timeout; marked failed.", ctx.job_id, ctx.attempt)

    def recover(self) -> RecoveryReport:
        assert self._broker is not None
        return recover_expired(self.engine, broker=self._broker)


class _Completion:
    """A job's success recorded in its message's ack transaction: ``completion(conn)`` writes it alone,
    :meth:`JobMiddleware._complete_batch` with the others of its ack batch (the ``batch`` attribute)."""

    __slots__ = ("ctx", "value", "message", "batch", "notices")

    def __init__(self, ctx: JobContext, value: Any, message: str | None, batch: Callable[..., Any]) -> None:
        self.ctx = ctx
        self.value = value
        self.message = message
        self.batch = batch
        self.notices = NoticeBuffer()

    def __call__(self, conn: sqlite3.Connection) -> Callable[[], None]:
        now = store.now_ms()
        self.notices = NoticeBuffer()  # a batch run again (database unavailable) starts afresh
        tx = db.Tx(conn, self.notices)
        if self.ctx._record_success(tx, self.value, now, message=self.message, workflow_step=False):
            return self.after_commit("succeeded")
        return self.not_completed(conn, now)

    def not_completed(self, conn: sqlite3.Connection, now: int) -> Callable[[], None]:
        """The success matched nothing: a cancel request committed first (→ cancelled), or stale."""
        ctx = self.ctx
        # Still current means the success's guard failed on the cancel request; not current means stale.
        seq = store.job_finish_if_current(conn, ctx.job_id, ctx.attempt, ctx.worker_id, "cancelled", None, now)
        if seq is None:
            return self.after_commit("stale")
        events.status_event(
            db.Tx(conn, self.notices),
            job_id=ctx.job_id,
            owner_id=ctx.owner_id,
            sequence=seq,
            status="cancelled",
            now=now,
            workflow_step=False,
            attempt=ctx.attempt,
        )
        return self.after_commit("cancelled")

    def after_commit(self, final: str) -> Callable[[], None]:
        ctx = self.ctx

        def after() -> None:
            self.notices.deliver()
            if final == "stale":
                ctx._stale("outcome ok")
                lifecycle("job.stale_write", ctx.job_id, ctx.kind, ctx.attempt, outcome="stale")
                return
            ctx.completed = final == "succeeded"
            event = "job.completed" if final == "succeeded" else "job.cancelled"
            lifecycle(event, ctx.job_id, ctx.kind, ctx.attempt, outcome=final, duration_s=_elapsed(ctx))

        return after


class _ClaimRequest:
    """One worker thread's claim through the broker's ack writer: ``request(conn)`` runs it alone,
    :meth:`JobMiddleware._claim_batch` with the others of its batch."""

    __slots__ = ("job_id", "notices", "_claim")

    def __init__(self, job_id: str, claim: Callable[[db.Tx], store.JobRow | None]) -> None:
        self.job_id = job_id
        self.notices = NoticeBuffer()
        self._claim = claim

    def __call__(self, conn: sqlite3.Connection) -> store.JobRow | None:
        self.notices = NoticeBuffer()  # a batch run again (database unavailable) starts afresh
        return self._claim(db.Tx(conn, self.notices))


class _Keeper:
    """One thread per worker process: lease renewal, timeouts and periodic recovery."""

    def __init__(self, middleware: JobMiddleware, broker: Broker) -> None:
        self._mw = middleware
        self._broker = broker
        self.interval_s = max(0.05, middleware.settings.job_lease_ttl_s / 3)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tenure-job-keeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        recovery_every = self._mw.settings.recovery_interval_s
        next_recovery = time.monotonic() + recovery_every
        tick = min(self.interval_s, PROGRESS_INTERVAL_S)
        next_beat = 0.0
        while not self._stopped.wait(tick):
            now = time.monotonic()
            try:
                if now >= next_beat:
                    next_beat = now + self.interval_s
                    self._mw.renew_leases()
                self._mw.enforce_timeouts()
                self._mw.flush_progress()
                if now >= next_recovery:
                    next_recovery = now + recovery_every
                    self._mw.recover()
            except Exception:
                logger.exception("Job keeper iteration failed; retrying.")


def run_current_job() -> None:
    """The body of every job actor: run the kind's function for the claimed job and record its outcome."""
    ctx = current_job()
    if ctx is None:
        raise RuntimeError("a job actor ran without JobMiddleware on its broker (add jobs.JobMiddleware)")
    run_job(_middleware_of(ctx), ctx)


def run_job(mw: JobMiddleware, ctx: JobContext) -> None:
    """Run the claimed attempt *ctx* in this thread and record its outcome through *mw*."""
    kind: Kind = ctx._kind  # type: ignore[attr-defined]
    mw._track(ctx)
    try:
        _run_and_record(mw, ctx, kind)
    finally:
        mw._untrack(ctx)


def _run_and_record(mw: JobMiddleware, ctx: JobContext, kind: Kind) -> None:
    outcome, value = "ok", None
    try:
        try:
            ctx._arm()
            value = kind.fn(ctx, **ctx.payload)
        finally:
            ctx._disarm()
    except JobCancelled:
        outcome = "cancelled"
    except (JobTimeout, TimeoutInterrupt):
        outcome = "timeout"
    except StaleAttempt:
        return
    except BaseException as e:  # every failure of user code is an outcome, even interrupts
        if isinstance(e, kind.never_retry):
            # A failure the kind declares final (bad input, a missing file): its one-line error is the whole
            # story, and a traceback per bad upload would bury real faults in the log (kept at DEBUG).
            logger.warning(
                "Job %s attempt %d failed: %s",
                ctx.job_id,
                ctx.attempt,
                public_error(e),
                exc_info=logger.isEnabledFor(logging.DEBUG),
            )
        else:
            logger.warning("Job %s attempt %d raised %s.", ctx.job_id, ctx.attempt, type(e).__name__, exc_info=True)
        outcome, value = "error", e
    if ctx.timed_out and outcome != "ok":
        outcome = "timeout"
    if outcome == "ok":
        if ctx.completed:
            # Completed in its own result_transaction: finish() is not called, so tell the observers here
            # (tenure_jobs_finished_total{outcome="succeeded"} counts it).
            lifecycle(
                "job.completed", ctx.job_id, kind.name, ctx.attempt, outcome="succeeded", duration_s=_elapsed(ctx)
            )
            return
        try:
            value = store.dumps(value)
        except (TypeError, ValueError) as e:
            outcome, value = "error", TypeError(f"the job's result is not JSON-serialisable: {e}")
    mw.finish(ctx, kind, outcome, value)


def _middleware_of(ctx: JobContext) -> JobMiddleware:
    for m in ctx._broker.middleware:
        if isinstance(m, JobMiddleware):
            return m
    raise RuntimeError("JobMiddleware is not installed on the broker")


def install(broker: Broker, settings: Settings | None = None, **kwargs: Any) -> JobMiddleware:
    """Add a :class:`JobMiddleware` to *broker*, first in line so it claims before anything else runs.

    Returns:
      The middleware.
    """
    mw = JobMiddleware(settings, **kwargs)
    first = type(broker.middleware[0]) if broker.middleware else None
    broker.add_middleware(mw, before=first) if first is not None else broker.add_middleware(mw)
    return mw
