"""Recovery of jobs whose worker stopped renewing their lease (crash, kill, partition).

An expired running job becomes:

- ``cancelled`` if a cancel was requested (the request is honoured, nothing runs again);
- ``queued`` with a fresh message if its kind is safe to rerun and attempts remain (the next claim
  makes it the next attempt);
- ``failed`` if its kind is safe to rerun but that was its last attempt;
- ``interrupted`` with a review hint otherwise: a kind with external effects is never replayed
  automatically.

Each decision is one transition (:func:`jobs.transitions.recover`, :func:`jobs.transitions.interrupt`)
whose guarded UPDATE still requires the expired lease and the attempt/worker that were read, so
recovery racing a late heartbeat, a claim or another recovery changes nothing twice. Its status event
says what happened: ``reason: lease expired``, the attempt, and the worker and host that lost it.
Called at worker start, periodically by workers, by the scheduler's resync, and for one job by a
claim that finds it expired. The periodic pass also ends the exits (:mod:`jobs.exit_store`) of
timed-out attempts whose worker died before their thread returned.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from dramatiq.broker import Broker
from sqlalchemy import Engine

from broker import SQLiteBroker

from . import db, exit_store, store, transitions
from .exit_store import ExitRow
from .publish import prepare_broker, resolve_broker, same_sqlite_file

logger = logging.getLogger(__name__)

#: Jobs handled per recovery transaction.
RECOVERY_BATCH = 100


@dataclass(frozen=True)
class RecoveryReport:
    requeued: int = 0
    cancelled: int = 0
    interrupted: int = 0
    failed: int = 0

    def __add__(self, other: RecoveryReport) -> RecoveryReport:
        return RecoveryReport(
            self.requeued + other.requeued,
            self.cancelled + other.cancelled,
            self.interrupted + other.interrupted,
            self.failed + other.failed,
        )

    @property
    def total(self) -> int:
        return self.requeued + self.cancelled + self.interrupted + self.failed


def recover_expired(engine: Engine, now: int | None = None, *, broker: Broker | None = None) -> RecoveryReport:
    """Recover every running job whose lease expired before *now* (ms; default: the clock).

    Parameters:
      engine: The job database.
      now: Injected clock, for tests.
      broker: Where requeued jobs' messages go (default: Dramatiq's global broker). With the SQLite
        broker on the same file, only jobs of queues this broker declared are requeued here, because
        declaring a queue inside a worker would make it consume that queue; the others are left to a
        process that declares them.

    Returns:
      Counts of what happened.
    """
    broker = resolve_broker(broker)
    prepare_broker(broker)
    report = RecoveryReport()
    ended: list[ExitRow] = []
    while True:
        with db.write(engine) as tx:
            at = store.now_ms() if now is None else now
            batch = recover_in(tx, broker, at, limit=RECOVERY_BATCH)
            if batch.total < RECOVERY_BATCH:  # the last batch's transaction also ends expired exits
                ended = exit_store.exit_delete_expired(tx.conn, at, RECOVERY_BATCH)
        report += batch
        if batch.total < RECOVERY_BATCH:
            break
    for row in ended:
        logger.warning(
            "Job %s attempt %d timed out and was still exiting when its worker %s stopped renewing it; ended.",
            row.job_id,
            row.attempt,
            row.worker_id,
        )
    if report.total:
        logger.warning(
            "Recovered expired jobs: %d requeued, %d cancelled, %d interrupted, %d failed.",
            report.requeued,
            report.cancelled,
            report.interrupted,
            report.failed,
        )
    return report


def recover_in(tx: db.Tx, broker: Broker, now: int, *, limit: int, job_id: str | None = None) -> RecoveryReport:
    """Recover expired jobs inside the open write transaction *tx* (see :func:`recover_expired`)."""
    conn = tx.conn
    tx.broker = tx.broker or broker
    in_file = same_sqlite_file(conn, broker)
    queues = sorted(broker.queues) if in_file and isinstance(broker, SQLiteBroker) else None
    counts = {"requeued": 0, "cancelled": 0, "interrupted": 0, "failed": 0}
    for job in store.job_list_expired(conn, now, limit, job_id=job_id, queues=queues):
        if not job.safe_to_rerun and not job.cancel_requested:
            if transitions.interrupt(tx, job, now=now):
                counts["interrupted"] += 1
            continue
        outcome = transitions.recover(tx, job, now=now, broker=broker)
        if outcome is not None:
            counts[outcome] += 1
    return RecoveryReport(**counts)
