"""The actor body: run the kind's function for the claimed attempt and hand what happened to the completer.

A job's function returns (→ succeeded with its value), raises :class:`~jobs.errors.JobCancelled`
(→ cancelled), runs out of time (→ failed "Job timed out."), or raises anything else (→ the kind's
retry policy: the same job's next attempt after a backoff, or failed). Dramatiq never sees the
exception: the job layer's policy is the only one. A function that completed its job in its own
``result_transaction`` has nothing left to record.
"""

from __future__ import annotations

import logging

from .. import db, exit_store, store, tracing
from ..context import JobContext, TimeoutInterrupt
from ..errors import JobCancelled, JobTimeout, StaleAttempt, public_error
from ..lifecycle import lifecycle
from ..registry import Kind
from .completer import TIMED_OUT, Cancelled, Completer, Failed, Outcome, Retry, Succeeded
from .worker import WorkerState

logger = logging.getLogger(__name__)


class Runner:
    """Runs attempts of one worker process and records their outcomes through *completer*."""

    def __init__(self, worker: WorkerState, completer: Completer) -> None:
        self.worker = worker
        self.completer = completer

    def __call__(self, ctx: JobContext) -> None:
        """Run the claimed attempt *ctx* in this thread and record its outcome."""
        self.worker.track(ctx)
        try:
            with tracing.span("tenure.job.run", ctx.job_id, ctx.kind, attempt=ctx.attempt) as span:
                outcome = _outcome(ctx, ctx._kind)  # type: ignore[attr-defined]
                if span is not None and outcome is not None:
                    span.set_attribute("tenure.job.outcome", type(outcome).__name__.lower())
                    if isinstance(outcome, Failed | Retry):
                        tracing.failed(span, type(outcome).__name__.lower())
            if outcome is not None:
                self.record(ctx, outcome)
        finally:
            self.worker.untrack(ctx)
            if ctx.exiting:
                self._exited(ctx)

    def _exited(self, ctx: JobContext) -> None:
        """The thread of an attempt that timed out while still running has returned: release the job."""
        ctx.exiting = False
        try:
            with db.write(self.worker.engine) as tx:
                exit_store.exit_delete(tx.conn, ctx.execution.job_id, ctx.execution.worker_id)
        except Exception:
            logger.exception(
                "Could not record that job %s attempt %d exited; its exit lease expires within a lease TTL.",
                ctx.job_id,
                ctx.attempt,
            )
            return
        logger.warning("Job %s attempt %d exited after its timeout.", ctx.job_id, ctx.attempt)

    def record(self, ctx: JobContext, outcome: Outcome) -> None:
        """Record *outcome* of *ctx* through the completer (a stale attempt's is refused and reported)."""
        if ctx.lost and not isinstance(outcome, Succeeded):
            return
        ctx.finishing = True
        try:
            with tracing.span("tenure.job.complete", ctx.job_id, ctx.kind, attempt=ctx.attempt) as span:
                final = self.completer.finish(ctx, outcome, broker=self.worker.broker or ctx._broker)
                if span is not None:
                    span.set_attribute("tenure.job.final", final)
        except Exception:
            logger.exception(
                "Could not record the outcome of job %s attempt %d; recovery will handle it when its lease expires.",
                ctx.job_id,
                ctx.attempt,
            )
            final = "unknown"
        if final == "stale":
            ctx._stale(f"outcome {type(outcome).__name__.lower()}")
            lifecycle("job.stale_write", ctx.job_id, ctx.kind, ctx.attempt, outcome="stale")
        if final != "deferred":  # a deferred success is settled by its message's ack
            ctx.completed = final == "succeeded"
        if not isinstance(outcome, Succeeded):
            ctx._remove_outputs()


def _outcome(ctx: JobContext, kind: Kind) -> Outcome | None:
    """Run *kind*'s function; what to record (None: nothing, the attempt was superseded or completed)."""
    try:
        try:
            ctx._arm()
            value = kind.fn(ctx, **ctx.payload)
        finally:
            ctx._disarm()
    except JobCancelled:
        return Failed(TIMED_OUT) if ctx.timed_out else Cancelled()
    except (JobTimeout, TimeoutInterrupt):
        return Failed(TIMED_OUT)
    except StaleAttempt:
        return None
    except BaseException as e:  # every failure of user code is an outcome, even interrupts
        if ctx.timed_out:
            return Failed(TIMED_OUT)
        return failure(ctx, kind, e)
    if ctx.completed:
        return None  # completed in its own result_transaction
    try:
        return Succeeded(store.dumps(value))
    except (TypeError, ValueError) as e:
        return failure(ctx, kind, TypeError(f"the job's result is not JSON-serialisable: {e}"))


def failure(ctx: JobContext, kind: Kind, exc: BaseException) -> Outcome:
    """The outcome of an attempt that raised *exc*: a retry while attempts remain, else failed."""
    if isinstance(exc, kind.never_retry):
        # A failure the kind declares final (bad input, a missing file): its one-line error is the whole
        # story, and a traceback per bad upload would bury real faults in the log (kept at DEBUG).
        logger.warning(
            "Job %s attempt %d failed: %s",
            ctx.job_id,
            ctx.attempt,
            public_error(exc),
            exc_info=logger.isEnabledFor(logging.DEBUG),
        )
    else:
        logger.warning("Job %s attempt %d raised %s.", ctx.job_id, ctx.attempt, type(exc).__name__, exc_info=True)
    error = public_error(exc)
    if not isinstance(exc, kind.never_retry) and ctx.attempt < ctx.max_attempts:
        return Retry(error, max(0.0, float(kind.backoff(ctx.attempt))))
    return Failed(error)
