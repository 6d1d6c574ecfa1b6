"""Read-side services for the web layer: list, get and events of jobs an owner may see."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Engine

from . import db, retention_store, store
from .errors import JobNotFound
from .records import JobEventRecord, JobRecord
from .status import JobStatus

#: Most rows one call returns.
MAX_LIMIT = 500


def running_jobs_submitted_before(engine: Engine, before_ms: int) -> int:
    """How many running jobs were submitted before *before_ms* (ms epoch): e.g. before a settings save."""
    with db.read(engine) as conn:
        return store.job_count_running_created_before(conn, before_ms)


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


@dataclass(frozen=True)
class JobChange:
    """One entry of the global change feed: which job, which of its events, and the job's state.

    ``id`` is global and increases in commit order (a cursor any process can resume from);
    ``sequence``/``type`` name the job's event; ``status`` is the status the event recorded (for
    ``status`` events) or the job's current one; ``progress``/``progress_message`` are the job's
    current values. Never the payload, event data, paths or worker internals.
    """

    id: int
    job_id: str
    owner_id: str
    sequence: int
    type: str
    status: str
    progress: float | None
    progress_message: str | None
    created_at: datetime


@dataclass(frozen=True)
class ChangePage:
    """What :func:`changes_after` returns (unpacks as ``items, oldest_retained_id, head_id``)."""

    items: list[JobChange]
    #: Every event from this id on is still stored (0: none): the oldest stored id, or one past the
    #: highest id retention deleted. A cursor below ``oldest_retained_id - 1`` may have lost events.
    oldest_retained_id: int
    #: The newest id when read (0: none); when fewer than *limit* items came back, every id up to it
    #: was examined, so a caller may advance its cursor there (past other owners' changes).
    head_id: int

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter((self.items, self.oldest_retained_id, self.head_id))


def changes_after(
    engine: Engine, after_id: int, *, owner_id: str | None = None, is_admin: bool = False, limit: int = 100
) -> ChangePage:
    """The global, commit-ordered change feed: events with id ``> after_id`` the caller may see.

    Admins (``is_admin``) see every job's changes; others only *owner_id*'s. Oldest first, at most
    *limit* (capped at :data:`MAX_LIMIT`).

    Raises:
      NotImplementedError: The database is not SQLite.
    """
    if not is_admin and owner_id is None:
        raise ValueError("owner_id is required unless is_admin")
    with db.read(engine) as conn:
        rows, oldest, newest = store.event_changes_after(
            conn, max(0, after_id), None if is_admin else owner_id, max(1, min(limit, MAX_LIMIT))
        )
        # Retention deletes events of old jobs anywhere below the newest id: a cursor below the
        # highest deleted id may have skipped one, so that is where "retained" starts for a resume.
        pruned = retention_store.pruned_through(conn)
    return ChangePage([_change(r) for r in rows], max(oldest, pruned + 1) if pruned else oldest, newest)


def _change(r: store.ChangeRow) -> JobChange:
    status = r.status
    if r.type == "status":
        try:
            status = str(json.loads(r.data).get("status") or status)
        except (ValueError, AttributeError):
            pass
    return JobChange(
        id=r.id,
        job_id=r.job_id,
        owner_id=r.owner_id,
        sequence=r.sequence,
        type=r.type,
        status=status,
        progress=r.progress,
        progress_message=r.progress_message,
        created_at=datetime.fromtimestamp(r.created_at / 1000, tz=UTC),
    )


def _ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


@dataclass(frozen=True)
class FinishedJob:
    """When a finished job was created, started and finished (for throughput and latency charts)."""

    status: str
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime


def finished_since(
    engine: Engine, since: datetime, *, owner_id: str | None, is_admin: bool = False, limit: int = 200_000
) -> list[FinishedJob]:
    """Jobs that finished at or after *since*, oldest first: the owner's, or everyone's for an admin
    (``owner_id=None`` requires ``is_admin``). One indexed query, however many jobs exist before *since*."""
    if owner_id is None and not is_admin:
        raise ValueError("owner_id is required unless is_admin")
    with db.read(engine) as conn:
        rows = store.job_finished_since(conn, _ms(since), None if is_admin and owner_id is None else owner_id, limit)
    return [
        FinishedJob(
            status=status,
            created_at=_dt(created),
            started_at=_dt(started) if started is not None else None,
            completed_at=_dt(completed),
        )
        for status, created, started, completed in rows
    ]


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)
