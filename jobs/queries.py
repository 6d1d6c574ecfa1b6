"""Read-side services: jobs, pages of jobs, counts, events, activity and the change feed an owner may see.

Every filter is applied in SQL (:mod:`jobs.read_store`): a page is full until the last one, a count
is exact, at any table size. A caller is an owner (``owner_id``) or an admin (``is_admin``: every
owner's jobs, optionally filtered by owner).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, Engine

from . import admission, attempts, dag, db, exit_store, read_store, retention_store, store
from .attempts import AttemptRecord
from .errors import CursorExpired, JobNotFound
from .read_store import JobFilterSQL
from .read_store import unsearchable as unsearchable  # the rule the search box's grammar tells users about
from .records import JobEventRecord, JobRecord
from .status import JobStatus

#: Most rows one call returns.
MAX_LIMIT = 500
#: Most changes one :func:`changes_after` call returns: above the live feed's backlog bound
#: (``LIVE_MAX_BACKLOG``, 1,000), so a client that far behind is told to resync instead of catching up.
MAX_CHANGES = 5_000
#: The largest time a cursor may name (9999-12-31): a later one lies after every job.
_MAX_MS = 253_402_300_799_000


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a list, a count or a bulk action is about; every field is optional.

    ``search``: an id prefix, or a case-insensitive substring of the kind, resource, summary or error (a
    term of one or two ASCII characters: an id prefix only, so one that is not hex is :func:`unsearchable`);
    several terms (a tuple): a job matches every one.
    ``owner_id``: for admins (an owner sees only their own jobs whatever this says).
    """

    statuses: tuple[str, ...] = ()
    kind: str | None = None
    queue: str | None = None
    owner_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    search: str | tuple[str, ...] | None = None
    parent_job_id: str | None = None
    #: Only jobs that are no workflow step.
    top_level: bool = False


@dataclass(frozen=True)
class JobPage:
    items: list[JobRecord]
    #: Where the next page starts (None: this was the last page).
    next_cursor: str | None


def _ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _scoped(where: JobFilter, owner_id: str, is_admin: bool) -> JobFilterSQL:
    for status in where.statuses:
        JobStatus(status)  # ValueError for an unknown one
    terms = (where.search,) if isinstance(where.search, str) else where.search or ()
    # NUL ends an FTS5 query string ("unterminated string") and PostgreSQL text cannot hold one: dropped.
    search = tuple(dict.fromkeys(t for t in (term.replace("\x00", "").strip() for term in terms) if t))
    return JobFilterSQL(
        owner_id=where.owner_id if is_admin else owner_id,
        statuses=tuple(dict.fromkeys(where.statuses)),
        kind=where.kind,
        queue=where.queue,
        created_after=None if where.created_after is None else _ms(where.created_after),
        created_before=None if where.created_before is None else _ms(where.created_before),
        search=search,
        parent_job_id=where.parent_job_id,
        top_level=where.top_level,
    )


def get_job(engine: Engine, job_id: str, *, owner_id: str, is_admin: bool = False) -> JobRecord:
    """One job.

    Raises:
      JobNotFound: No such job, or another owner's (the two are indistinguishable).
    """
    with db.read(engine) as conn:
        row = _visible(store.job_get(conn, job_id), owner_id, is_admin)
        (record,) = _records(conn, [row])
        if row.held is not None:
            detail = admission.waiting_detail(conn, row.held, row.held_on or "", now=store.now_ms())
            record = dataclasses.replace(record, waiting=detail)
    return record


def _records(conn: Connection, rows: list[store.JobRow]) -> list[JobRecord]:
    """The public records of *rows*, each failed one saying whether its timed-out thread is still exiting."""
    failed = [r.id for r in rows if r.status == JobStatus.FAILED]
    exiting = exit_store.exit_live_job_ids(conn, failed, store.now_ms())
    return [JobRecord.from_row(r, still_exiting=r.id in exiting) for r in rows]


def _visible(row: store.JobRow | None, owner_id: str, is_admin: bool) -> store.JobRow:
    """*row* if the caller may see it; another owner's job is indistinguishable from a missing one."""
    if row is None or (not is_admin and row.owner_id != owner_id):
        raise JobNotFound()
    return row


def list_jobs(
    engine: Engine,
    *,
    owner_id: str,
    is_admin: bool = False,
    where: JobFilter | None = None,
    before: JobRecord | None = None,
    limit: int = 50,
) -> list[JobRecord]:
    """Matching jobs newest first: the owner's, or everyone's for an admin.

    Parameters:
      where: The filters (default: none).
      before: Continue after this record (keyset pagination).
      limit: At most this many (capped at :data:`MAX_LIMIT`).

    Raises:
      ValueError: An unknown status.
    """
    cursor = None if before is None else (_ms(before.created_at), before.id)
    with db.read(engine) as conn:
        rows = read_store.job_list(
            conn, _scoped(where or JobFilter(), owner_id, is_admin), before=cursor, limit=max(1, min(limit, MAX_LIMIT))
        )
        return _records(conn, rows)


def page_jobs(
    engine: Engine,
    where: JobFilter,
    *,
    owner_id: str,
    is_admin: bool = False,
    cursor: str | None = None,
    limit: int = 50,
) -> JobPage:
    """One page of matching jobs newest first, and the cursor of the next (None after the last page).

    Raises:
      ValueError: An unknown status, or a cursor this function did not return.
    """
    limit = max(1, min(limit, MAX_LIMIT))
    with db.read(engine) as conn:
        rows = read_store.job_list(
            conn, _scoped(where, owner_id, is_admin), before=decode_page_cursor(cursor), limit=limit + 1
        )
        items = _records(conn, rows[:limit])
    more = len(rows) > limit
    return JobPage(items, encode_page_cursor(items[-1]) if more else None)


def steps_of(
    engine: Engine, parent_ids: list[str], *, owner_id: str, is_admin: bool = False
) -> dict[str, list[JobRecord]]:
    """The steps of each of the workflows *parent_ids* the caller may see (parent id → steps, oldest first,
    and steps created together — in the same millisecond, as a workflow's first steps are — in the order
    they run: after the steps they depend on); jobs without steps are absent. At most :data:`MAX_LIMIT`
    parents."""
    with db.read(engine) as conn:
        rows = read_store.job_steps_of(conn, parent_ids[:MAX_LIMIT], None if is_admin else owner_id)
        edges = read_store.step_edges(conn, [r.id for r in rows])
    steps: dict[str, list[JobRecord]] = {}
    for row in dag.in_run_order(rows, edges):
        steps.setdefault(str(row.parent_job_id), []).append(JobRecord.from_row(row))
    return steps


def count_jobs(engine: Engine, where: JobFilter, *, owner_id: str, is_admin: bool = False) -> int:
    """How many jobs match, exactly (a bulk action's dry run)."""
    with db.read(engine) as conn:
        return read_store.job_count(conn, _scoped(where, owner_id, is_admin))


def encode_page_cursor(record: JobRecord) -> str:
    return f"{_ms(record.created_at)}.{record.id}"


_PAGE_CURSOR = re.compile(r"(\d{1,15})\.([0-9a-zA-Z_-]{0,100})")


def decode_page_cursor(cursor: str | None) -> tuple[int, str] | None:
    """The ``(created_at, id)`` position of a page cursor.

    Raises:
      ValueError: Not a cursor :func:`page_jobs` returned.
    """
    if not cursor:
        return None
    match = _PAGE_CURSOR.fullmatch(cursor)
    if match is None:
        raise ValueError("malformed cursor: not one this API returned")
    return min(int(match[1]), _MAX_MS), match[2]


def job_events(
    engine: Engine, job_id: str, *, owner_id: str, is_admin: bool = False, after: int = 0, limit: int = 100
) -> list[JobEventRecord]:
    """The job's events with ``sequence > after``, in order (a live feed passes its last sequence).

    Raises:
      JobNotFound: No such job, or another owner's.
    """
    with db.read(engine) as conn:
        _visible(store.job_get(conn, job_id), owner_id, is_admin)
        events = store.event_list_after(conn, job_id, after, max(1, min(limit, MAX_LIMIT)))
    return [JobEventRecord.from_row(e) for e in events]


def job_attempts(engine: Engine, job_id: str, *, owner_id: str, is_admin: bool = False) -> list[AttemptRecord]:
    """The job's attempts, oldest first: when each ran, how it ended, what happened next (:mod:`jobs.attempts`).

    Raises:
      JobNotFound: No such job, or another owner's.
    """
    with db.read(engine) as conn:
        row = _visible(store.job_get(conn, job_id), owner_id, is_admin)
        # a status event per move: each attempt opens and ends with one, the submit writes one (room to spare)
        statuses = store.event_list_of_type(conn, job_id, attempts.EVENT_TYPE, 4 * row.max_attempts + 10)
        exiting = exit_store.exit_get_live(conn, job_id, store.now_ms())
    return attempts.attempts_from(
        [JobEventRecord.from_row(e) for e in statuses], still_exiting=None if exiting is None else exiting.attempt
    )


def running_jobs_submitted_before(engine: Engine, before_ms: int) -> int:
    """How many running jobs were submitted before *before_ms* (ms epoch): e.g. before a settings save."""
    with db.read(engine) as conn:
        return store.job_count_running_created_before(conn, before_ms)


# -- activity ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Activity:
    """Jobs that finished in one bucket (of one queue or kind when grouped); durations in seconds."""

    start: datetime
    group: str | None
    succeeded: int
    failed: int
    cancelled: int
    interrupted: int
    wait_p50_s: float | None
    run_p50_s: float | None
    run_p95_s: float | None
    run_max_s: float | None


def activity(
    engine: Engine,
    *,
    since: datetime,
    bucket_s: int,
    owner_id: str | None,
    is_admin: bool = False,
    until: datetime | None = None,
    group_by: str | None = None,
) -> list[Activity]:
    """Finished jobs per bucket of *bucket_s* seconds from *since* (floored to the minute) to *until*
    (default: now), grouped by ``queue`` or ``kind`` if asked; every bucket of the window is present
    (empty ones as zeros). Percentiles are nearest-rank (:mod:`jobs.read_store`).

    Raises:
      ValueError: ``owner_id`` missing for a non-admin, a non-positive bucket, an unknown grouping.
    """
    if owner_id is None and not is_admin:
        raise ValueError("owner_id is required unless is_admin")
    if bucket_s <= 0:
        raise ValueError("bucket_s must be positive")
    if group_by not in (None, "queue", "kind"):
        raise ValueError(f"unknown grouping {group_by!r}; queue or kind")
    start = since.replace(second=0, microsecond=0)
    end = until or datetime.now(UTC)
    bucket_ms = bucket_s * 1000
    with db.read(engine) as conn:
        rows = read_store.job_activity(
            conn,
            since=_ms(start),
            until=_ms(end) + 1,
            bucket_ms=bucket_ms,
            owner_id=owner_id,
            group_by=group_by,
        )
    found = {(r.bucket, r.group): r for r in rows}
    groups = sorted({r.group for r in rows}, key=lambda g: g or "") or [None]
    n_buckets = int((_ms(end) - _ms(start)) // bucket_ms) + 1
    out: list[Activity] = []
    for b in range(n_buckets):
        for g in groups:
            r = found.get((b, g))
            out.append(
                Activity(
                    start=start + timedelta(seconds=b * bucket_s),
                    group=g,
                    succeeded=r.succeeded if r else 0,
                    failed=r.failed if r else 0,
                    cancelled=r.cancelled if r else 0,
                    interrupted=r.interrupted if r else 0,
                    wait_p50_s=_s(r.wait_p50_ms) if r else None,
                    run_p50_s=_s(r.run_p50_ms) if r else None,
                    run_p95_s=_s(r.run_p95_ms) if r else None,
                    run_max_s=_s(r.run_max_ms) if r else None,
                )
            )
    return out


def _s(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


# -- the change feed ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobChange:
    """One entry of the change feed: which job, which of its events, and the job's state.

    ``cursor`` is this entry's position (a cursor any web process on any host resumes from);
    ``sequence``/``type`` name the job's event; ``status`` is the status the event recorded (for
    ``status`` events) or the job's current one; ``progress``/``progress_message`` are the job's
    current values. Never the payload, event data, paths or worker internals.
    """

    cursor: str
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
    items: list[JobChange]
    #: Where to resume: after the last item, or — when fewer than *limit* came back — after everything
    #: examined (past other owners' changes).
    cursor: str


class CursorUnknown(ValueError):
    """A change cursor this database never handed out (another database, or a reset one)."""

    def __init__(self, head: str) -> None:
        super().__init__(f"unknown change cursor; head is {head}")
        self.head = head


def encode_position(position: tuple[int, int]) -> str:
    """A change-feed position as its cursor string (``123`` on SQLite, ``xid.id`` on PostgreSQL)."""
    return str(position[0]) if position[1] == 0 else f"{position[0]}.{position[1]}"


def decode_position(cursor: str) -> tuple[int, int]:
    """The position a change cursor names; raises ValueError for a malformed one."""
    a, dot, b = cursor.partition(".")
    if not a.isdigit() or len(a) > 19 or (dot and (not b.isdigit() or len(b) > 19)):
        raise ValueError("malformed change cursor")
    return int(a), int(b) if dot else 0


def change_head(engine: Engine) -> str:
    """The cursor after every change visible now (where a new subscriber starts)."""
    with db.read(engine) as conn:
        return encode_position(read_store.head_position(conn))


def changes_after(
    engine: Engine, cursor: str, *, owner_id: str | None = None, is_admin: bool = False, limit: int = 100
) -> ChangePage:
    """The commit-ordered change feed after *cursor*: the events the caller may see, oldest first.

    Admins see every job's changes; others only *owner_id*'s. Gap-free and duplicate-free across web
    processes and hosts, each job's changes in commit order (see :func:`jobs.read_store.event_changes_after`).

    Raises:
      ValueError: A malformed cursor.
      CursorUnknown: A cursor after the head (not one this database handed out).
      CursorExpired: Retention deleted events after the cursor: resync (``head``) instead of resuming.
    """
    if not is_admin and owner_id is None:
        raise ValueError("owner_id is required unless is_admin")
    position = decode_position(cursor)
    with db.read(engine) as conn:
        changes, end = changes_from(conn, position, None if is_admin else owner_id, limit)
    return ChangePage(changes, encode_position(end))


def changes_from(
    conn: Connection, position: tuple[int, int], owner_id: str | None, limit: int
) -> tuple[list[JobChange], tuple[int, int]]:
    """:func:`changes_after` by position, in the caller's read transaction (*owner_id* ``None``: every
    owner's changes): the changes and the position everything up to which was examined."""
    if position > read_store.position_bound(conn):
        raise CursorUnknown(encode_position(read_store.head_position(conn)))
    if position < retention_store.pruned_position(conn):
        raise CursorExpired(encode_position(read_store.head_position(conn)))
    # (a cursor past the head, when the head moved back, reads nothing until the head is past it again)
    rows, end = read_store.event_changes_after(conn, position, owner_id, max(1, min(limit, MAX_CHANGES)))
    return [_change(r) for r in rows], end


def _change(r: read_store.ChangeRow) -> JobChange:
    status = r.status
    if r.type == "status":
        try:
            status = str(json.loads(r.data).get("status") or status)
        except (ValueError, AttributeError):
            pass
    return JobChange(
        cursor=encode_position(r.position),
        job_id=r.job_id,
        owner_id=r.owner_id,
        sequence=r.sequence,
        type=r.type,
        status=status,
        progress=r.progress,
        progress_message=r.progress_message,
        created_at=_dt(r.created_at),
    )


def admission_usage(engine: Engine) -> admission.AdmissionUsage:
    """What waits for admission per queue and reason, and every declared limit's use (admins' view)."""
    with db.read(engine) as conn:
        return admission.usage(conn, now=store.now_ms())
