"""Read-side services for the web layer: list, get and events of jobs an owner may see."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine

from . import db, store
from .errors import JobNotFound
from .records import JobEventRecord, JobRecord
from .status import JobStatus

#: Most rows one call returns.
MAX_LIMIT = 500


def get_job(engine: Engine, job_id: str, *, owner_id: str, is_admin: bool = False) -> JobRecord:
    """One job.

    Raises:
      JobNotFound: No such job, or another owner's (the two are indistinguishable).
    """
    with db.read(engine) as conn:
        row = store.job_get(conn, job_id)
    if row is None or (not is_admin and row.owner_id != owner_id):
        raise JobNotFound()
    return JobRecord.from_row(row)


def list_jobs(
    engine: Engine,
    *,
    owner_id: str,
    is_admin: bool = False,
    status: JobStatus | str | None = None,
    kind: str | None = None,
    before: JobRecord | None = None,
    limit: int = 50,
) -> list[JobRecord]:
    """Jobs newest first: the owner's, or everyone's for an admin.

    Parameters:
      before: Continue after this record (keyset pagination).
      limit: At most this many (capped at :data:`MAX_LIMIT`).

    Raises:
      ValueError: An unknown status.
    """
    status_value = JobStatus(status).value if status is not None else None
    cursor = None
    if before is not None:
        cursor = (_ms(before.created_at), before.id)
    with db.read(engine) as conn:
        rows = store.job_list(
            conn,
            owner_id=None if is_admin else owner_id,
            status=status_value,
            kind=kind,
            before=cursor,
            limit=max(1, min(limit, MAX_LIMIT)),
        )
    return [JobRecord.from_row(r) for r in rows]


def job_events(
    engine: Engine, job_id: str, *, owner_id: str, is_admin: bool = False, after: int = 0, limit: int = 100
) -> list[JobEventRecord]:
    """The job's events with ``sequence > after``, in order (a live feed passes its last sequence).

    Raises:
      JobNotFound: No such job, or another owner's.
    """
    with db.read(engine) as conn:
        row = store.job_get(conn, job_id)
        if row is None or (not is_admin and row.owner_id != owner_id):
            raise JobNotFound()
        events = store.event_list_after(conn, job_id, after, max(1, min(limit, MAX_LIMIT)))
    return [JobEventRecord.from_row(e) for e in events]


def _ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)
