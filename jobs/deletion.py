"""``delete_job``: a user removes a finished job (a workflow with its steps) and everything it recorded.

A deletion takes the same unit retention prunes (:mod:`jobs.retention`): a top-level job and its
workflow descendants, with their events, dependency edges, idempotency rows and published outbox
rows, in one write transaction (SQL in :mod:`jobs.retention_store`). Only a unit whose every member
is terminal may go; a workflow step goes with its workflow, never alone; a job another job still
references (a retry of it, a retried workflow reusing its step) stays until that one goes.

On SQLite the newest ``job_events`` row is the live feed's position: deleting it would make SQLite
hand its rowid out again and a client holding it as a cursor would skip the next event. Retention
waits for the next event anywhere; so does a deletion (:class:`JobNotDeletable` says so).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from . import db, retention_store, store
from .errors import JobNotDeletable, JobNotFound
from .status import TERMINAL_STATUSES

#: Events deleted per statement; a unit's events beyond this go in further statements of the same
#: transaction (a user's deletion is one job, not a retention sweep).
EVENT_BATCH = 10_000


@dataclass(frozen=True)
class Deleted:
    """What :func:`delete_job` removed: the job ids (the job first, then its steps) and their events."""

    job_ids: tuple[str, ...]
    events: int


def delete_job(target: Engine | Session, job_id: str, *, by: str, is_admin: bool = False) -> Deleted:
    """Delete a finished job, or a finished workflow with all its steps.

    Parameters:
      target: The job database, or a Session whose transaction to join.
      by: The acting owner id; only the job's owner (or an admin) may delete it.

    Raises:
      JobNotFound: No such job, or another owner's (indistinguishable).
      JobNotDeletable: The job (or a step of the workflow) has not finished, it is a step of a
        workflow, another job references it, or (SQLite) it holds the newest live-feed entry.
    """
    with db.transaction(target) as tx:
        conn = tx.conn
        job = store.job_get_for_update(conn, job_id)
        if job is None or (not is_admin and job.owner_id != by):
            raise JobNotFound()
        if job.parent_job_id is not None:
            raise JobNotDeletable(f"This job is a step of workflow {job.parent_job_id}; delete the workflow instead.")
        members = retention_store.unit_members(conn, [job_id])
        retention_store.lock_jobs(conn, [m.id for m in members if m.id != job_id])
        running = [m for m in members if m.status not in {str(s) for s in TERMINAL_STATUSES}]
        if running:
            what = "The job" if running[0].id == job_id else f"Its step {running[0].id}"
            raise JobNotDeletable(f"{what} is {running[0].status}; only finished jobs can be deleted.")
        ids = [m.id for m in members]
        outside = [(a, b) for a, b in retention_store.references_into(conn, ids) if b not in ids]
        if outside:
            raise JobNotDeletable(
                f"Job {outside[0][1]} refers to this one (its retry, or a retried workflow reusing it); "
                "delete that first."
            )
        if retention_store.newest_event_job(conn) in ids:
            raise JobNotDeletable(
                "This job holds the live feed's newest entry; it can be deleted once any other job changes."
            )
        events = 0
        while batch := retention_store.delete_events(conn, ids, EVENT_BATCH):
            events += batch
        retention_store.delete_published_outbox_of(conn, ids)
        retention_store.delete_jobs(conn, ids)
    return Deleted((job_id, *(i for i in ids if i != job_id)), events)
