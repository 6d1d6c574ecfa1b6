"""Binding Dramatiq messages to job records: :class:`JobMiddleware`, the hooks of job execution.

For a message that carries a job id (see :mod:`jobs.publish`):

1. ``before_process_message`` claims the job (:mod:`~jobs.execution.claimer`). If that matches nothing
   — cancelled, finished, running under a live lease, a duplicate delivery — the message is skipped and
   acked. A message for a kind this worker cannot run ends its job ``failed`` ("no handler for kind X").
2. The claimed attempt is bound to the worker thread (:mod:`jobs.current`); the kind's actor runs it
   through the :class:`~jobs.execution.runner.Runner`, whose outcome the completer records — with the
   message's ack when the SQLite broker shares the job file (:mod:`~jobs.execution.completer`).
3. A :class:`~jobs.execution.keeper.LeaseKeeper` thread per process renews leases, enforces timeouts and
   recovers expired jobs, from worker boot to worker shutdown.
"""

from __future__ import annotations

import logging
from typing import Any

from dramatiq.broker import Broker
from dramatiq.middleware import Middleware, SkipMessage
from sqlalchemy import Engine

from settings.environment import Settings

from .. import current, db, store, transitions
from ..publish import JOB_ID_OPTION, LIMITS_OPTION
from ..recovery import recover_expired
from ..registry import Registry
from ..schema import check_database_at_head
from .claimer import Claimer
from .completer import BatchCompleter, retrying
from .keeper import LeaseKeeper
from .runner import Runner
from .tracing import TracingMiddleware
from .worker import WorkerState

logger = logging.getLogger(__name__)


class JobMiddleware(Middleware):
    """Claims, binding, heartbeats and recovery for job messages.

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
        self.worker = WorkerState(settings, engine=engine, registry=registry)
        self.settings = self.worker.settings
        self.registry = self.worker.registry
        self.check_schema = check_schema
        self.claimer = Claimer(self.worker)
        #: The actor body of this process's jobs; it records outcomes through the (ack-)batched completer.
        self.runner = Runner(self.worker, BatchCompleter(self.worker))
        self.keeper = LeaseKeeper(self.worker)

    @property
    def engine(self) -> Engine:
        return self.worker.engine

    @property
    def worker_id(self) -> str:
        return self.worker.worker_id

    def start_keeper(self, broker: Broker) -> LeaseKeeper:
        """Start this process's keeper thread for *broker* (idempotent)."""
        if self.worker.broker is None:
            self.worker.broker = broker
        self.keeper.start()
        return self.keeper

    def stop(self) -> None:
        """Stop the keeper thread (lease renewal, timeouts, recovery) of this process."""
        self.keeper.stop()

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
        self.start_keeper(broker)
        try:
            recover_expired(self.engine, broker=broker)
        except Exception:
            logger.exception("Recovery at worker start failed; the keeper retries it.")

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        # After the worker threads were joined: jobs still finishing during shutdown keep their leases.
        self.stop()

    # -- messages --------------------------------------------------------------------------------
    def before_process_message(self, broker: Broker, message: Any) -> None:
        current.release()
        job_id = message.options.get(JOB_ID_OPTION)
        if job_id is None:
            return
        try:
            self.start_keeper(broker)
            kind = self.registry.find(message.actor_name)
            if kind is None or message.actor_name not in broker.actors:
                retrying(f"Failing job {job_id}", lambda: self._fail_unknown(job_id, message.actor_name))
                raise SkipMessage(f"no handler for kind {message.actor_name}")
            limits = tuple(message.options.get(LIMITS_OPTION) or transitions.NO_LIMITS)
            ctx = retrying(
                f"Claim of job {job_id}",
                lambda: self.claimer.claim(broker, job_id, message.queue_name, limits),  # type: ignore[arg-type]
            )
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
        if self.worker.acks_in_job_file(broker) and hasattr(message, "in_ack_transaction"):
            ctx.settle_with = message
        current.bind(ctx, self.runner)

    def before_nack(self, broker: Broker, message: Any) -> None:
        # Dramatiq's consumer thread dead-letters a message for an actor this process does not
        # declare before any process_message hook runs; its job must end failed, not wait forever.
        job_id = message.options.get(JOB_ID_OPTION)
        if job_id is not None and message.actor_name not in broker.actors:
            try:
                retrying(f"Failing job {job_id}", lambda: self._fail_unknown(job_id, message.actor_name))
            except Exception:
                logger.exception("Could not fail job %s of unknown kind %s.", job_id, message.actor_name)

    def after_process_message(self, broker: Broker, message: Any, *, result: Any = None, exception: Any = None) -> None:
        current.release()

    def after_skip_message(self, broker: Broker, message: Any) -> None:
        current.release()

    def _fail_unknown(self, job_id: str, kind: str) -> None:
        error = f"no handler for kind {kind}"
        logger.error("Job %s: %s on this worker; the job is failed.", job_id, error)
        with db.write(self.engine) as tx:
            job = store.job_get(tx.conn, job_id)
            if job is not None:
                transitions.fail_queued(tx, job, error, now=store.now_ms())


def install(broker: Broker, settings: Settings | None = None, **kwargs: Any) -> JobMiddleware:
    """Add a :class:`JobMiddleware` to *broker*, first in line so it claims before anything else runs,
    behind only a :class:`~jobs.execution.tracing.TracingMiddleware` (whose span the claim is part of).

    Returns:
      The middleware.
    """
    mw = JobMiddleware(settings, **kwargs)
    for added in (mw, TracingMiddleware()):
        first = type(broker.middleware[0]) if broker.middleware else None
        broker.add_middleware(added, before=first) if first is not None else broker.add_middleware(added)
    return mw
