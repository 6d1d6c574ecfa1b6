"""One thread per worker process: lease renewal, timeouts, pending progress and periodic recovery.

Every third of the job lease TTL it renews the leases of the attempts this process runs (an attempt
whose lease was taken over is marked lost: its writes are fenced); it interrupts attempts past their
deadline (and fails one whose thread does not respond within a lease TTL more, keeping it *still
exiting*: its exit lease is renewed here until the thread returns, so a manual retry waits for it); it
writes progress
reported since the last write (``JobContext.progress`` writes at most every
:data:`~jobs.context.PROGRESS_INTERVAL_S`); and every ``recovery_interval_s`` it recovers expired jobs
(:mod:`jobs.recovery`).
"""

from __future__ import annotations

import logging
import os
import threading
import time

from dramatiq.broker import Broker

from .. import db, exit_store, store, transitions
from ..context import PROGRESS_INTERVAL_S, JobContext
from ..recovery import RecoveryReport, recover_expired
from .completer import TIMED_OUT
from .worker import WorkerState

logger = logging.getLogger(__name__)


class LeaseKeeper:
    """The keeper of one worker process: its thread runs from worker boot until after the worker's threads
    were joined; each duty is also a method of its own."""

    def __init__(self, worker: WorkerState) -> None:
        self.worker = worker
        self.interval_s = max(0.05, worker.settings.job_lease_ttl_s / 3)
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0

    @property
    def broker(self) -> Broker:
        assert self.worker.broker is not None, "the keeper runs for a broker (JobMiddleware sets it)"
        return self.worker.broker

    def start(self) -> None:
        """Start the thread in this process (a thread started before a fork belongs to the parent)."""
        if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
            return
        self._stopped = threading.Event()
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="tenure-job-keeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None and self._pid == os.getpid():
            self._thread.join(timeout=5)
        self._thread = None

    def _run(self) -> None:
        recovery_every = self.worker.settings.recovery_interval_s
        next_recovery = time.monotonic() + recovery_every
        tick = min(self.interval_s, PROGRESS_INTERVAL_S)
        next_beat = 0.0
        while not self._stopped.wait(tick):
            now = time.monotonic()
            try:
                if now >= next_beat:
                    next_beat = now + self.interval_s
                    self.renew_leases()
                    self.renew_exits()
                self.enforce_timeouts()
                self.flush_progress()
                if now >= next_recovery:
                    next_recovery = now + recovery_every
                    self.recover()
            except Exception:
                logger.exception("Job keeper iteration failed; retrying.")

    def flush_progress(self) -> None:
        """Write the progress running attempts reported since their last write."""
        for ctx in self.worker.running():
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
        contexts = self.worker.running()
        if not contexts:
            return
        lost: list[JobContext] = []
        with db.write(self.worker.engine) as tx:
            expires = store.now_ms() + self.worker.lease_ttl_ms
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
        grace_s = self.worker.settings.job_lease_ttl_s
        for ctx in self.worker.running():
            if ctx.completed or ctx.lost or now < ctx.deadline:
                continue
            if ctx._interrupt_if_overdue(now):
                logger.warning("Job %s attempt %d timed out; interrupting it.", ctx.job_id, ctx.attempt)
            elif now >= ctx.deadline + grace_s:
                # The thread did not respond (stuck in C code): fail the attempt in the database; the
                # guard fences whatever the thread writes later.
                self._fail_overdue(ctx)

    def _fail_overdue(self, ctx: JobContext) -> None:
        with db.write(self.worker.engine) as tx:
            exiting = transitions.time_out_still_exiting(
                tx, ctx.execution, TIMED_OUT, now=store.now_ms(), exit_lease_ms=self.worker.lease_ttl_ms
            )
        ctx.lost = True
        ctx.exiting = exiting
        logger.error(
            "Job %s attempt %d did not stop after its timeout; marked failed, still exiting (its thread runs on).",
            ctx.job_id,
            ctx.attempt,
        )

    def renew_exits(self) -> None:
        """Renew the exit leases of timed-out attempts whose threads still run (see :meth:`_fail_overdue`)."""
        exiting = [ctx for ctx in self.worker.running() if ctx.exiting]
        if not exiting:
            return
        with db.write(self.worker.engine) as tx:
            expires = store.now_ms() + self.worker.lease_ttl_ms
            for ctx in exiting:
                if not exit_store.exit_renew(tx.conn, ctx.execution.job_id, ctx.execution.worker_id, expires):
                    ctx.exiting = False  # recovery ended it (this process looked dead): nothing to hold

    def recover(self) -> RecoveryReport:
        return recover_expired(self.worker.engine, broker=self.broker)
