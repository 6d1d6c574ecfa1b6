"""Job rows written straight into ``jobs``, one at a time or 100,000 at once, for tests that need jobs in
a given status without driving them there.

A row satisfies the CHECKs of ``jobs/models.py`` for its status (:func:`status_columns`), and the insert
fires the schema's own triggers (revision 0009: the search index, on SQLite and PostgreSQL), so the
derived search rows stay in step. No events are written (``event_seq`` 0, which the CHECK allows):
nothing these rows serve reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from jobs.status import TERMINAL_STATUSES, JobStatus

WORKER = "walk-host:1:test"
#: A lease far in the future: a running row here is never taken for an expired one.
LEASE_MS = 3_600_000

COLUMNS = (
    "id", "owner_id", "kind", "actor_name", "queue_name", "resource_type", "resource_id", "idempotency_key",
    "request_digest", "payload", "config", "priority", "status", "attempt", "max_attempts", "timeout_s",
    "safe_to_rerun", "worker_id", "lease_expires_at", "run_after", "progress", "progress_message", "result",
    "error", "cancel_requested_at", "event_seq", "created_at", "updated_at", "started_at", "completed_at",
    "retry_of_job_id", "parent_job_id", "summary",
)  # fmt: skip
_NAMES = ", ".join(COLUMNS)


def status_columns(status: JobStatus, now: int) -> dict[str, Any]:
    """The columns the CHECKs tie to *status*: a lease and a worker while running, a completion time once
    finished, neither while queued."""
    running = status == JobStatus.RUNNING
    return {
        "status": str(status),
        "worker_id": WORKER if running else None,
        "lease_expires_at": now + LEASE_MS if running else None,
        "started_at": None if status == JobStatus.QUEUED else now,
        "completed_at": now if status in TERMINAL_STATUSES else None,
    }


def job_row(
    job_id: str,
    status: JobStatus,
    *,
    created_at: int,
    owner_id: str = "u1",
    kind: str = "walk",
    queue: str = "default",
    summary: str | None = None,
) -> dict[str, Any]:
    """A full ``jobs`` row of *status*, created (and, if it ran, started and finished) at *created_at*."""
    return {
        "id": job_id,
        "owner_id": owner_id,
        "kind": kind,
        "actor_name": kind,
        "queue_name": queue,
        "resource_type": None,
        "resource_id": None,
        "idempotency_key": None,
        "request_digest": "0" * 64,
        "payload": "{}",
        "config": "{}",
        "priority": 0,
        "attempt": 0 if status == JobStatus.QUEUED else 1,
        "max_attempts": 3,
        "timeout_s": 60,
        "safe_to_rerun": True,
        "run_after": created_at,
        "progress": None,
        "progress_message": None,
        "result": None,
        "error": "RuntimeError: boom" if status == JobStatus.FAILED else None,
        "cancel_requested_at": None,
        "event_seq": 0,
        "created_at": created_at,
        "updated_at": created_at,
        "retry_of_job_id": None,
        "parent_job_id": None,
        "summary": summary,
        **status_columns(status, created_at),
    }


def insert_jobs(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """*rows* (:func:`job_row`) in the caller's transaction, on its driver connection: SQLAlchemy's
    per-row parameter handling costs more than SQLite's insert (100,000 rows: ~3x). PostgreSQL: one
    ``COPY`` (its row triggers fire as for an INSERT); SQLite: one executemany INSERT."""
    values = [tuple(row[c] for c in COLUMNS) for row in rows]
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        if conn.dialect.name == "postgresql":
            with cursor.copy(f"COPY jobs ({_NAMES}) FROM STDIN") as copy:
                for value in values:
                    copy.write_row(value)
        else:
            cursor.executemany(f"INSERT INTO jobs ({_NAMES}) VALUES ({', '.join('?' * len(COLUMNS))})", values)
    finally:
        cursor.close()
