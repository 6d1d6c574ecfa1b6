"""Recovery of jobs whose worker stopped renewing their lease (crash, kill, partition).

An expired running job becomes:

- ``cancelled`` if a cancel was requested (the request is honoured, nothing runs again);
- ``queued`` with a fresh message if its kind is safe to rerun and attempts remain (the next claim
  makes it the next attempt);
- ``failed`` if its kind is safe to rerun but that was its last attempt;
- ``interrupted`` with a review hint otherwise: a kind with external effects is never replayed
  automatically.

Each decision is one guarded UPDATE that still requires the expired lease and the attempt/worker
that were read, so recovery racing a late heartbeat, a claim or another recovery changes nothing twice.
Called at worker start, periodically by workers, by the scheduler's resync, and for one job by a
claim that finds it expired.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from dramatiq.broker import Broker
from sqlalchemy import Engine

from broker import SQLiteBroker

from . import db, events, store
from .publish import prepare_broker, publish_in_transaction, resolve_broker, same_sqlite_file

logger = logging.getLogger(__name__)

#: Jobs handled per recovery transaction.
RECOVERY_BATCH = 100
INTERRUPTED_HINT = (
    "Interrupted: the worker was lost while this job was running. It may have had external effects, so it "
    "was not re-run automatically; review it and retry it if needed."
)
LOST_LAST_ATTEMPT = "The worker running the last attempt was lost."


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
    while True:
        with db.write(engine) as tx:
            batch = recover_in(tx, broker, store.now_ms() if now is None else now, limit=RECOVERY_BATCH)
        report += batch
        if batch.total < RECOVERY_BATCH:
            break
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
        outcome, seq, data = _recover_one(tx, broker, job, now)
        if seq is None:
            continue
        counts[outcome] += 1
        status = {"requeued": "queued"}.get(outcome, outcome)
        events.status_event(
            tx,
            job_id=job.id,
            owner_id=job.owner_id,
            sequence=seq,
            status=status,
            now=now,
            reason="lease expired",
            **data,
        )
    return RecoveryReport(**counts)


def _recover_one(tx: db.Tx, broker: Broker, job: store.ExpiredJob, now: int) -> tuple[str, int | None, dict[str, Any]]:
    conn = tx.conn
    if job.cancel_requested:
        return (
            "cancelled",
            store.job_recover_finish(conn, job.id, job.attempt, job.worker_id, "cancelled", None, now),
            {},
        )
    if not job.safe_to_rerun:
        seq = store.job_recover_finish(conn, job.id, job.attempt, job.worker_id, "interrupted", INTERRUPTED_HINT, now)
        return "interrupted", seq, {"attempt": job.attempt}
    if job.attempt >= job.max_attempts:
        seq = store.job_recover_finish(conn, job.id, job.attempt, job.worker_id, "failed", LOST_LAST_ATTEMPT, now)
        return "failed", seq, {"attempt": job.attempt}
    seq = store.job_recover_requeue(conn, job.id, job.attempt, job.worker_id, now)
    if seq is not None:
        publish_in_transaction(
            conn,
            broker,
            job_id=job.id,
            actor_name=job.actor_name,
            queue_name=job.queue_name,
            priority=job.priority,
            delay_ms=0,
            now=now,
        )
    return "requeued", seq, {"attempt": job.attempt}
