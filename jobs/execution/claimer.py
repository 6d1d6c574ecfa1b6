"""Claiming the job of a message before its actor runs: one claim, or one statement per ack batch.

A claim is :func:`jobs.transitions.claim` (queued → running, ``attempt + 1``, this worker, a fresh
lease), committed before the actor starts. A job still running under an expired lease (a redelivered
message of a worker that died) is recovered first, then claimed in the same transaction, so its lost
attempt is recorded like any other recovery's. With the SQLite broker on the job file, the claim joins
the broker's next ack batch on the same file; elsewhere it is group-committed with the process's other
hot-path writes (:func:`jobs.group_commit.hot_write`). Either way the claims of one batch are one
UPDATE (:func:`jobs.transitions.claim_many`).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from dramatiq.broker import Broker

from .. import db, store, tracing, transitions
from ..context import JobContext
from ..group_commit import Together, hot_write
from ..lifecycle import AfterCommitBuffer
from ..publish import prepare_broker
from ..recovery import recover_in
from .worker import WorkerState


class Claimer:
    """The claims of one worker process (see the module docstring)."""

    def __init__(self, worker: WorkerState) -> None:
        self.worker = worker

    def claim(
        self,
        broker: Broker,
        job_id: str,
        queue_name: str | None = None,
        limits: tuple[str | None, str | None] = transitions.NO_LIMITS,
    ) -> JobContext | None:
        """Claim *job_id* for this worker; its running context, or None when it is not claimable (a
        duplicate delivery, cancelled, finished, running under another worker's live lease, or its key
        is at its limit: *limits*, the keys its message names, see :func:`jobs.admission.claim_refusal`)."""
        with tracing.span("tenure.job.claim", job_id, queue=queue_name) as span:
            ctx = self._claim(broker, job_id, queue_name, limits)
            if span is not None:
                span.set_attribute("tenure.job.claimed", ctx is not None)
                if ctx is not None:
                    span.set_attributes(tracing.job_attributes(kind=ctx.kind, attempt=ctx.attempt))
            return ctx

    def _claim(
        self, broker: Broker, job_id: str, queue_name: str | None, limits: tuple[str | None, str | None]
    ) -> JobContext | None:
        worker = self.worker
        prepare_broker(broker)
        worker_id, lease_ms = worker.worker_id, worker.lease_ttl_ms

        def one(tx: db.Tx) -> store.JobRow | None:
            tx.broker = broker
            return transitions.claim(tx, job_id, worker=worker_id, lease_ms=lease_ms, now=store.now_ms(), limits=limits)

        if queue_name is not None and worker.acks_in_job_file(broker):
            request = _ClaimRequest(job_id, one, limits, broker)
            job = broker.write_with_acks(queue_name, request, batch=self._batch)  # type: ignore[attr-defined]
            request.pending.run()
        else:
            job = hot_write(worker.engine, one, Together(self._together, (job_id, limits, broker)))
        if job is None:
            with db.write(worker.engine) as tx:
                # Maybe it is running under an expired lease (its worker died): recover it now rather than
                # at the next recovery, which records the lost attempt, and claim it if that requeued it.
                if recover_in(tx, broker, store.now_ms(), limit=1, job_id=job_id).requeued:
                    job = one(tx)
            if job is None:
                return None
        ctx = JobContext(engine=worker.engine, broker=broker, job=job, worker_id=worker_id, lease_ttl_ms=lease_ms)
        ctx._kind = worker.registry.find(job.kind)  # type: ignore[attr-defined]
        return ctx

    def _batch(self, conn: sqlite3.Connection, requests: list[_ClaimRequest]) -> list[store.JobRow | None]:
        """The claims of one ack batch in one UPDATE and one INSERT of their status events."""
        txs = [r.tx(conn) for r in requests]
        return self._claim_many(txs, [r.job_id for r in requests], [r.limits for r in requests])

    def _together(
        self, txs: list[db.Tx], items: list[tuple[str, tuple[str | None, str | None], Broker]]
    ) -> list[store.JobRow | None]:
        """The claims of one group-committed batch, the same way."""
        for tx, (_, _, broker) in zip(txs, items, strict=True):
            tx.broker = broker
        return self._claim_many(txs, [job_id for job_id, _, _ in items], [limits for _, limits, _ in items])

    def _claim_many(
        self, txs: list[db.Tx], job_ids: list[str], limits: list[tuple[str | None, str | None]]
    ) -> list[store.JobRow | None]:
        worker = self.worker
        return transitions.claim_many(
            txs, job_ids, worker=worker.worker_id, lease_ms=worker.lease_ttl_ms, now=store.now_ms(), limits=limits
        )


class _ClaimRequest:
    """One worker thread's claim through the broker's ack writer: ``request(conn)`` runs it alone,
    :meth:`Claimer._batch` with the others of its batch."""

    __slots__ = ("job_id", "limits", "pending", "_broker", "_claim")

    def __init__(
        self,
        job_id: str,
        claim: Any,
        limits: tuple[str | None, str | None] = transitions.NO_LIMITS,
        broker: Broker | None = None,
    ) -> None:
        self.job_id = job_id
        self.limits = limits
        self.pending = AfterCommitBuffer()
        self._broker = broker
        self._claim = claim

    def tx(self, conn: sqlite3.Connection) -> db.Tx:
        self.pending = AfterCommitBuffer()  # a batch run again (database unavailable) starts afresh
        tx = db.Tx(conn, self.pending)  # type: ignore[arg-type]
        tx.broker = self._broker  # the messages of the jobs its claims admit
        return tx

    def __call__(self, conn: sqlite3.Connection) -> store.JobRow | None:
        return self._claim(self.tx(conn))  # type: ignore[no-any-return]
