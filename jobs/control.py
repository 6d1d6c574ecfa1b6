"""``cancel``, ``retry`` and ``run_now``: the same answers from every entry point."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from broker import SQLiteBroker, expedite_delayed
from settings.environment import Settings

from . import admission, db, events, exit_store, store, transitions
from .admission_store import HeldJob
from .enqueue import retry_key
from .errors import JobNotFound, JobNotRetryable, JobStillExiting, UnknownKind
from .publish import JOB_ID_OPTION, prepare_broker, resolve_broker, same_sqlite_file
from .records import JobRecord
from .registry import Registry
from .registry import registry as default_registry
from .status import RETRYABLE_STATUSES, JobStatus
from .submit import submit
from .workflows import retry_workflow


class CancelOutcome(StrEnum):
    #: It was queued: cancelled at once; its message will be skipped when delivered.
    CANCELLED = "cancelled"
    #: It is running: the request is recorded; the job stops at its next checkpoint and can no
    #: longer succeed (a result commit after this request is refused).
    REQUESTED = "requested"
    #: A cancel had already been requested; nothing changed.
    ALREADY_REQUESTED = "already_requested"
    #: It had already finished (see ``job.status``); nothing changed.
    ALREADY_FINISHED = "already_finished"


@dataclass(frozen=True)
class CancelResult:
    outcome: CancelOutcome
    job: JobRecord

    @property
    def message(self) -> str:
        return {
            CancelOutcome.CANCELLED: "Job cancelled.",
            CancelOutcome.REQUESTED: "Cancel requested; the job stops at its next checkpoint.",
            CancelOutcome.ALREADY_REQUESTED: "Cancel was already requested.",
            CancelOutcome.ALREADY_FINISHED: f"Job already finished ({self.job.status}).",
        }[self.outcome]


def _visible(job: store.JobRow | None, by: str, is_admin: bool) -> store.JobRow:
    if job is None or (not is_admin and job.owner_id != by):
        raise JobNotFound()
    return job


def cancel(target: Engine | Session, job_id: str, *, by: str, is_admin: bool = False) -> CancelResult:
    """Cancel a job: at once if queued, at its next checkpoint if running; a clear answer if finished.

    Takes the same write lock as a result commit (``BEGIN IMMEDIATE`` / the job's row lock), so
    exactly one of them wins and the other sees it.

    Parameters:
      target: The job database, or a Session whose transaction to join (``db.write_session``).
      job_id: The job.
      by: The caller's owner id (only the owner, or an admin, may cancel).
      is_admin: Whether the caller may act on anyone's job.

    Raises:
      JobNotFound: No such job, or another owner's (indistinguishable on purpose).

    Returns:
      What happened and the job as it now is.
    """
    with db.transaction(target) as tx:
        job = _visible(store.job_get_for_update(tx.conn, job_id), by, is_admin)
        now = store.now_ms()
        outcome: CancelOutcome
        if job.status == JobStatus.QUEUED:
            cancelled = transitions.cancel_queued(tx, job, now=now, by=by)
            assert cancelled  # under the lock nothing moved it
            outcome = CancelOutcome.CANCELLED
        elif job.status == JobStatus.RUNNING:
            requested = transitions.request_cancel(tx, job, now=now, by=by)
            outcome = CancelOutcome.REQUESTED if requested else CancelOutcome.ALREADY_REQUESTED
        else:
            outcome = CancelOutcome.ALREADY_FINISHED
        after = store.job_get(tx.conn, job_id)
        assert after is not None
    return CancelResult(outcome, JobRecord.from_row(after))


def retry(
    target: Engine | Session,
    job_id: str,
    *,
    by: str,
    is_admin: bool = False,
    registry: Registry | None = None,
    settings: Settings | None = None,
) -> JobRecord:
    """Run a finished job again as a NEW job (``retry_of_job_id`` points at the old one).

    Only failed, cancelled and interrupted jobs qualify, once their execution has exited: a terminal
    status is written by the execution itself or after its lease expired, and any late write of
    the old attempt is fenced; an attempt that timed out while its thread would not stop is still
    exiting until that thread returns or its worker dies (:mod:`jobs.exit_store`). The new job has the
    same kind, payload, resource and priority, the old job's owner, and a fresh config snapshot.

    A job is retried once: asking again (a double click, two operators, a bulk retry over jobs
    already retried) returns the retry made the first time, with ``created`` False, even when the
    requests race (the retry is submitted with an idempotency key of the old job's id). To run it
    once more, retry the newest job of the chain.

    Raises:
      JobNotFound: No such job, or another owner's.
      JobNotRetryable: The job is queued, running or succeeded.
      JobStillExiting: Its last attempt timed out and its thread is still exiting.
      UnknownKind: Its kind is no longer registered.

    Returns:
      The new job's record.
    """
    import json

    with db.read(db.engine_of(target)) as conn:
        job = _visible(store.job_get(conn, job_id), by, is_admin)
        exiting = exit_store.exit_get_live(conn, job_id, store.now_ms())
    if exiting is not None:
        raise JobStillExiting(
            f"job {job_id} timed out but attempt {exiting.attempt} is still exiting (its thread has not "
            "stopped); retry it once it has exited"
        )
    if JobStatus(job.status) not in RETRYABLE_STATUSES:
        raise JobNotRetryable(
            f"job {job_id} is {job.status}; only failed, cancelled or interrupted jobs can be retried"
        )
    if job.actor_name == "":  # a workflow parent: re-run the steps that did not succeed
        return retry_workflow(target, job_id, by=by, is_admin=is_admin, registry=registry, settings=settings)
    resource = (job.resource_type, job.resource_id) if job.resource_type is not None else None
    return submit(
        target,
        owner_id=job.owner_id,
        kind=job.kind,
        payload=json.loads(job.payload),
        resource=resource,  # type: ignore[arg-type]
        idempotency_key=retry_key(job.id),
        priority=job.priority,
        max_attempts=job.max_attempts,
        timeout_s=job.timeout_s,
        registry=registry,
        settings=settings,
        retry_of_job_id=job.id,
        parent_job_id=job.parent_job_id,
    )


def run_now(
    target: Engine | Session,
    job_ids: Iterable[str],
    *,
    by: str = "system",
    registry: Registry | None = None,
    broker: Any = None,
) -> list[str]:
    """Clear the wait of queued jobs (a retry's backoff, or a submit delay): each may start at once.

    For the cause of a backoff that has gone away (the output root is writable again, say), so the
    jobs it held back need not sit out their delay. Each job's ``run_after`` becomes now and a
    ``run_now`` event is recorded. Its message becomes due in the same transaction: on the SQLite
    broker on the job file, the delayed message row itself is made ready (and idle consumers are
    woken after the commit); on any other broker a fresh message is published (through the outbox),
    and the old delayed one arrives later as a duplicate delivery that the guarded claim skips (or
    that starts a later backoff early: a backoff is a "not before" hint, see docs/jobs.md).

    Parameters:
      target: The job database, or a Session whose transaction to join (its brokers must be ready:
        ``jobs.publish.prepare_broker`` before the Session's transaction opens).
      job_ids: The jobs; any that are not queued with a pending wait (running, finished, due already,
        a workflow step waiting for its dependencies, unknown) are left alone.
      by: Who asked (recorded in the event).
      registry: Where the jobs' kinds (and so their brokers) are found.
      broker: The broker for a kind this process does not know (default: Dramatiq's global one).

    Returns:
      The ids of the jobs that were waiting and may now run, in the order given.
    """
    ids = list(dict.fromkeys(job_ids))
    if not ids:
        return []
    registry = registry or default_registry

    def broker_of(kind: str) -> Any:
        try:
            return registry.broker_for(kind)
        except UnknownKind:
            return resolve_broker(broker)

    # Brokers are made ready before the write transaction opens (see prepare_broker).
    with db.read(db.engine_of(target)) as conn:
        queued = [j for j in (store.job_get(conn, i) for i in ids) if j is not None and j.status == "queued"]
    for job in queued:
        prepare_broker(broker_of(job.kind), job.queue_name)
    woken: dict[int, tuple[SQLiteBroker, set[str]]] = {}
    with db.transaction(target) as tx:
        now = store.now_ms()
        expedited = [j for j in (store.job_run_now(tx.conn, i, now) for i in ids) if j is not None]
        groups: dict[tuple[int, str], list[store.ExpeditedJob]] = {}
        brokers: dict[int, Any] = {}
        for job in expedited:
            b = broker_of(job.kind)
            brokers[id(b)] = b
            groups.setdefault((id(b), job.queue_name), []).append(job)
        for (key, queue_name), group in groups.items():
            b = brokers[key]
            missing = group
            if same_sqlite_file(tx.conn, b):
                due = set(expedite_delayed(b, tx.conn, queue_name, option=JOB_ID_OPTION, values=[j.id for j in group]))
                woken.setdefault(key, (b, set()))[1].add(queue_name)
                missing = [j for j in group if j.id not in due]
            for job in missing:  # another broker, or no delayed message to move: a fresh one
                if job.held is None:  # one that waits for admission is admitted in its turn
                    admission.admit(tx, HeldJob.of(job, run_after=now), now=now, delay_ms=0, broker=b)
        for job in expedited:
            events.record(tx, job_id=job.id, sequence=job.sequence, type_="run_now", data={"by": by}, now=now)
        for b, queues in woken.values():
            tx.after_commit(lambda b=b, queues=queues: b.wake(queues))
    return [j.id for j in expedited]
