"""All SQL of executions still exiting (``job_exits``, revision 0014; :class:`jobs.models.JobExit`).

A row names an attempt that timed out while its thread would not stop: its job is already ``failed``
(the transition that wrote the row, :func:`jobs.transitions.time_out_still_exiting`), its thread runs
on. Invariants:

- at most one row per job (its last attempt: a failed job is never claimed again);
- ``lease_expires_at`` is renewed by the worker process running the thread (guarded by that worker's
  id), so a row whose lease expired belongs to a process that died: recovery ends it;
- a live row (``lease_expires_at >= now``) makes a manual retry of the job wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, text

#: The columns of an :class:`ExitRow`, in order.
_COLUMNS = "job_id, attempt, worker_id, timed_out_at, lease_expires_at"


def _exec(conn: Connection, sql: str, params: dict[str, Any]) -> Any:
    return conn.execute(text(sql), params)


@dataclass(frozen=True)
class ExitRow:
    job_id: str
    attempt: int
    worker_id: str
    timed_out_at: int
    lease_expires_at: int


def exit_insert(conn: Connection, job_id: str, attempt: int, worker: str, now: int, expires: int) -> None:
    _exec(
        conn,
        f"INSERT INTO job_exits ({_COLUMNS}) VALUES (:id, :attempt, :worker, :now, :expires)",
        {"id": job_id, "attempt": attempt, "worker": worker, "now": now, "expires": expires},
    )


def exit_renew(conn: Connection, job_id: str, worker: str, expires: int) -> bool:
    """Extend the exit lease of *worker*'s row (False: recovery ended it, or it is another worker's)."""
    return bool(
        _exec(
            conn,
            "UPDATE job_exits SET lease_expires_at = :expires WHERE job_id = :id AND worker_id = :worker",
            {"id": job_id, "worker": worker, "expires": expires},
        ).rowcount
    )


def exit_delete(conn: Connection, job_id: str, worker: str) -> ExitRow | None:
    """The thread of *worker*'s row returned: remove the row (None: recovery ended it first)."""
    row = _exec(
        conn,
        f"DELETE FROM job_exits WHERE job_id = :id AND worker_id = :worker RETURNING {_COLUMNS}",
        {"id": job_id, "worker": worker},
    ).fetchone()
    return None if row is None else ExitRow(*row)


def exit_delete_expired(conn: Connection, now: int, limit: int) -> list[ExitRow]:
    """Remove rows whose lease expired before *now* (their worker process died), oldest first."""
    rows = _exec(
        conn,
        "DELETE FROM job_exits WHERE job_id IN (SELECT job_id FROM job_exits WHERE lease_expires_at < :now "
        f"ORDER BY lease_expires_at LIMIT :limit) RETURNING {_COLUMNS}",
        {"now": now, "limit": limit},
    ).fetchall()
    return [ExitRow(*r) for r in rows]


def exit_get_live(conn: Connection, job_id: str, now: int) -> ExitRow | None:
    """The job's row if its lease is live at *now* (the thread is still exiting)."""
    row = _exec(
        conn,
        f"SELECT {_COLUMNS} FROM job_exits WHERE job_id = :id AND lease_expires_at >= :now",
        {"id": job_id, "now": now},
    ).fetchone()
    return None if row is None else ExitRow(*row)


def exit_live_job_ids(conn: Connection, job_ids: list[str], now: int) -> set[str]:
    """Which of *job_ids* have a live row at *now* (their timed-out thread is still exiting)."""
    if not job_ids:
        return set()
    stmt = text("SELECT job_id FROM job_exits WHERE job_id IN :ids AND lease_expires_at >= :now").bindparams(
        bindparam("ids", expanding=True)
    )
    return {r[0] for r in conn.execute(stmt, {"ids": job_ids, "now": now})}
