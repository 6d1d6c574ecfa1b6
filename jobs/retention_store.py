"""All SQL of retention pruning (:mod:`jobs.retention`) and of a user's deletion of a finished job
(:mod:`jobs.deletion`): finding, verifying and deleting old rows.

Tables touched (``jobs/models.py``; foreign keys from ``migrations/versions/0001_initial.py``):

- ``jobs``: ``retry_of_job_id`` and ``parent_job_id`` reference ``jobs`` with no ON DELETE action,
  so deleting a job that a kept row still references fails: the verification below never lets a
  unit go while such a row exists, and a workflow parent goes in the same statement as its steps
  (a constraint is checked at the end of the statement, in SQLite and PostgreSQL alike).
- ``job_events``, ``idempotency``, ``job_dependencies``: ON DELETE CASCADE. Events are deleted here
  first, in bounded batches, so the final job delete cascades over nothing large.
- ``outbox``: ON DELETE SET NULL. Published rows of pruned jobs are deleted with them; a pending row
  keeps its message (``job_id`` becomes NULL; its delivery finds no job and does nothing).

Index use: candidates come from ``ix_jobs_status_completed`` (revision 0007, partial: terminal
jobs only), members from ``ix_jobs_parent``, references from ``ix_jobs_retry_of`` and
``ix_job_dependencies_depends_on``, events by their primary key ``(job_id, sequence)``, outbox rows
by ``ix_outbox_job`` (0007) and ``ix_outbox_pending``. ``retention_marks`` (0007) records the
change-feed position of the newest event deleted, for the live feed (:func:`pruned_position`).

Every id list is bound as one expanding parameter; callers keep lists at most a batch long.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, text

from .models import TERMINAL_SQL


def _ids(sql: str, *names: str) -> object:
    """A text statement whose *names* parameters are id lists (``IN :name`` expands them)."""
    return text(sql).bindparams(*(bindparam(n, expanding=True) for n in names))


def _for_update(conn: Connection) -> str:
    # SQLite's BEGIN IMMEDIATE already holds the only write lock; PostgreSQL needs row locks so a
    # concurrent manual retry (an INSERT referencing the job) waits for this transaction.
    return " FOR UPDATE" if conn.dialect.name == "postgresql" else ""


@dataclass(frozen=True)
class Member:
    """One job of a unit (a root job and its workflow descendants)."""

    root_id: str
    id: str
    status: str
    completed_at: int | None


def candidate_roots(
    conn: Connection, status: str, before: int, after: tuple[int, str], limit: int
) -> list[tuple[int, str]]:
    """Top-level jobs of *status* finished before *before*, after the keyset position *after*.

    Returns:
      ``(completed_at, id)`` in that order, at most *limit*.
    """
    rows = conn.execute(
        text(
            "SELECT completed_at, id FROM jobs WHERE status = :status AND completed_at IS NOT NULL "
            "AND completed_at < :before AND parent_job_id IS NULL "
            "AND (completed_at > :after_t OR (completed_at = :after_t AND id > :after_id)) "
            "ORDER BY completed_at, id LIMIT :limit"
        ),
        {"status": status, "before": before, "after_t": after[0], "after_id": after[1], "limit": limit},
    ).all()
    return [(int(r[0]), str(r[1])) for r in rows]


def lock_jobs(conn: Connection, ids: Collection[str]) -> None:
    """Row-lock *ids* on PostgreSQL (no-op on SQLite)."""
    if ids and conn.dialect.name == "postgresql":
        conn.execute(_ids(f"SELECT id FROM jobs WHERE id IN :ids{_for_update(conn)}", "ids"), {"ids": list(ids)})


def unit_members(conn: Connection, root_ids: Collection[str]) -> list[Member]:
    """Every job of the units rooted at *root_ids* (roots without a parent; descendants at any depth)."""
    if not root_ids:
        return []
    rows = conn.execute(
        _ids(
            "WITH RECURSIVE unit(root_id, id) AS ("
            " SELECT id, id FROM jobs WHERE id IN :roots AND parent_job_id IS NULL"
            " UNION SELECT unit.root_id, j.id FROM jobs j JOIN unit ON j.parent_job_id = unit.id"
            ") SELECT unit.root_id, j.id, j.status, j.completed_at FROM unit JOIN jobs j ON j.id = unit.id",
            "roots",
        ),
        {"roots": list(root_ids)},
    ).all()
    return [Member(str(r[0]), str(r[1]), str(r[2]), None if r[3] is None else int(r[3])) for r in rows]


def references_into(conn: Connection, ids: Collection[str]) -> list[tuple[str, str]]:
    """``(referenced id, referencing id)`` for every row pointing at one of *ids*: a job's
    ``retry_of_job_id`` or a workflow dependency edge (``job_dependencies.depends_on_job_id``)."""
    if not ids:
        return []
    params = {"ids": list(ids)}
    retries = conn.execute(
        _ids("SELECT retry_of_job_id, id FROM jobs WHERE retry_of_job_id IN :ids", "ids"), params
    ).all()
    edges = conn.execute(
        _ids("SELECT depends_on_job_id, job_id FROM job_dependencies WHERE depends_on_job_id IN :ids", "ids"),
        params,
    ).all()
    return [(str(a), str(b)) for a, b in (*retries, *edges)]


def newest_event_job(conn: Connection) -> str | None:
    """The job owning the newest ``job_events`` row (SQLite: the highest rowid), or None.

    The live feed's global cursor is that rowid (``jobs.store.event_changes_after``). SQLite gives a
    new row ``max(rowid) + 1``, so deleting the newest row would hand its id out again and a client
    holding it as a cursor would skip the reused id. Retention never deletes that row, so the
    maximum never goes back and ids are never reused. Other databases have no such cursor.
    """
    if conn.dialect.name != "sqlite":
        return None
    row = conn.execute(text("SELECT job_id FROM job_events ORDER BY rowid DESC LIMIT 1")).first()
    return None if row is None else str(row[0])


def _newest_guard(conn: Connection, alias: str) -> str:
    # Belt and braces next to the per-job "keep the last event" rule: never the newest row (above).
    if conn.dialect.name != "sqlite":
        return ""
    return f" AND {alias}.rowid < (SELECT max(rowid) FROM job_events)"


#: The position (:mod:`jobs.read_store`) of the newest event retention deleted (``retention_marks``):
#: SQLite's rowid; PostgreSQL's change xid and id.
PRUNED_THROUGH = "job_events.pruned_through"
PRUNED_XID, PRUNED_ID = "job_events.pruned_xid", "job_events.pruned_id"


def pruned_position(conn: Connection) -> tuple[int, int]:
    """The change-feed position of the newest event retention has deleted (``(0, 0)``: none).

    A live-feed cursor below it may have skipped a deleted event: the feed reports it as expired so
    such a client resyncs rather than resuming over a silent gap.
    """
    names = [PRUNED_THROUGH] if conn.dialect.name == "sqlite" else [PRUNED_XID, PRUNED_ID]
    rows = dict(
        conn.execute(
            text("SELECT name, value FROM retention_marks WHERE name IN :names").bindparams(
                bindparam("names", expanding=True)
            ),
            {"names": names},
        ).all()
    )
    values = [int(rows.get(name, 0)) for name in names]
    return (values[0], 0) if len(values) == 1 else (values[0], values[1])


def _raise_pruned(conn: Connection, position: tuple[int, int]) -> None:
    if position <= pruned_position(conn):
        return
    marks = (
        {PRUNED_THROUGH: position[0]}
        if conn.dialect.name == "sqlite"
        else dict(zip((PRUNED_XID, PRUNED_ID), position, strict=True))
    )
    for name, value in marks.items():
        conn.execute(
            text(
                "INSERT INTO retention_marks (name, value) VALUES (:n, :v) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value"
            ),
            {"n": name, "v": value},
        )


def delete_events(conn: Connection, job_ids: Sequence[str], limit: int, *, finished_before: int | None = None) -> int:
    """Delete at most *limit* events of the terminal jobs among *job_ids*; returns how many.

    Without *finished_before*: every event (their jobs are about to be deleted). With it (event
    retention): only of jobs finished before then, and never a job's last event, so a kept job
    keeps the record of how it ended. The newest position deleted raises :func:`pruned_position` in the
    same transaction.
    """
    if not job_ids:
        return 0
    older = "" if finished_before is None else " AND j.completed_at < :before AND e.sequence < j.event_seq"
    where = (
        "FROM job_events e JOIN jobs j ON j.id = e.job_id"
        f" WHERE e.job_id IN :ids AND j.status IN ({TERMINAL_SQL}){older}{_newest_guard(conn, 'e')} LIMIT :limit"
    )
    params = {"ids": list(job_ids), "limit": limit, "before": finished_before}
    if conn.dialect.name != "sqlite":
        sql = (
            "DELETE FROM job_events WHERE (job_id, sequence) IN (SELECT e.job_id, e.sequence "
            f"{where}) RETURNING change_xid, change_id"
        )
        deleted_positions = [(int(x or 0), int(i or 0)) for x, i in conn.execute(_ids(sql, "ids"), params)]
        if deleted_positions:
            _raise_pruned(conn, max(deleted_positions))
        return len(deleted_positions)
    rowids = [int(r[0]) for r in conn.execute(_ids(f"SELECT e.rowid {where}", "ids"), params)]
    if not rowids:
        return 0
    deleted = conn.execute(_ids("DELETE FROM job_events WHERE rowid IN :rowids", "rowids"), {"rowids": rowids})
    _raise_pruned(conn, (max(rowids), 0))
    return int(deleted.rowcount)


def delete_published_outbox_of(conn: Connection, job_ids: Sequence[str]) -> int:
    """Delete the published outbox rows of *job_ids* (pending rows stay and lose their job id)."""
    if not job_ids:
        return 0
    return int(
        conn.execute(
            _ids("DELETE FROM outbox WHERE job_id IN :ids AND published_at IS NOT NULL", "ids"),
            {"ids": list(job_ids)},
        ).rowcount
    )


def delete_jobs(conn: Connection, job_ids: Sequence[str]) -> int:
    """Delete *job_ids* in one statement (idempotency rows and dependency edges cascade)."""
    if not job_ids:
        return 0
    return int(
        conn.execute(
            _ids(f"DELETE FROM jobs WHERE id IN :ids AND status IN ({TERMINAL_SQL})", "ids"), {"ids": list(job_ids)}
        ).rowcount
    )


def jobs_with_old_events(
    conn: Connection, status: str, before: int, after: tuple[int, str], limit: int
) -> list[tuple[int, str]]:
    """Jobs of *status* finished before *before* that still have events besides their last one.

    Returns:
      ``(completed_at, id)`` after the keyset position *after*, in that order, at most *limit*.
    """
    rows = conn.execute(
        text(
            "SELECT j.completed_at, j.id FROM jobs j WHERE j.status = :status AND j.completed_at IS NOT NULL "
            "AND j.completed_at < :before "
            "AND (j.completed_at > :after_t OR (j.completed_at = :after_t AND j.id > :after_id)) "
            "AND EXISTS (SELECT 1 FROM job_events e WHERE e.job_id = j.id AND e.sequence < j.event_seq) "
            "ORDER BY j.completed_at, j.id LIMIT :limit"
        ),
        {"status": status, "before": before, "after_t": after[0], "after_id": after[1], "limit": limit},
    ).all()
    return [(int(r[0]), str(r[1])) for r in rows]


def delete_published_outbox_before(conn: Connection, before: int, limit: int) -> int:
    """Delete at most *limit* outbox rows published before *before* (oldest first)."""
    return int(
        conn.execute(
            text(
                "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE published_at IS NOT NULL "
                "AND published_at < :before ORDER BY published_at, id LIMIT :limit)"
            ),
            {"before": before, "limit": limit},
        ).rowcount
    )
