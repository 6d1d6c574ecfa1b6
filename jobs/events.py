"""Appending job events and raising their notices, inside the caller's transaction."""

from __future__ import annotations

from typing import Any

from . import store
from .db import Tx
from .notify import Notice
from .status import TERMINAL_STATUSES

TERMINAL = frozenset(s.value for s in TERMINAL_STATUSES)


def record(
    tx: Tx,
    *,
    job_id: str,
    owner_id: str,
    sequence: int,
    type_: str,
    data: dict[str, Any],
    status: str,
    now: int,
    notice_type: str | None = None,
) -> None:
    """Insert event *sequence* (already reserved on the job row) and queue its notice for after commit."""
    store.event_insert(tx.conn, job_id, sequence, type_, store.dumps(data), now)
    tx.notify(Notice(job_id, owner_id, notice_type or ("status" if type_ == "status" else "event"), status, sequence))


def status_event(
    tx: Tx,
    *,
    job_id: str,
    owner_id: str,
    sequence: int,
    status: str,
    now: int,
    workflow_step: bool = True,
    **data: Any,
) -> None:
    """The event every status change writes: ``{"status": …, …}``.

    A step of a workflow reaching a final status moves its workflow on, in the same transaction;
    ``workflow_step=False`` says the caller knows the job is no step (its ``parent_job_id`` is NULL).
    """
    record(
        tx,
        job_id=job_id,
        owner_id=owner_id,
        sequence=sequence,
        type_="status",
        data={"status": status, **data},
        status=status,
        now=now,
    )
    if workflow_step and status in TERMINAL:
        from .workflows import on_job_finished  # late: workflows records events too

        on_job_finished(tx, job_id, status)


def status_events_many(conn: Any, now: int, entries: list[tuple[str, str, int, str, dict[str, Any]]]) -> list[Notice]:
    """:func:`status_event` for several jobs in one statement (SQLite, a raw connection).

    *entries*: ``(job_id, owner_id, sequence, status, data)``. Returns their notices, in order, for the
    caller to queue. Never moves a workflow on: the callers write ``running``, or a final status of
    jobs that are no workflow steps."""
    store.event_insert_many(
        conn,
        [
            (job_id, seq, "status", store.dumps({"status": status, **data}), now)
            for job_id, _, seq, status, data in entries
        ],
    )
    return [Notice(job_id, owner_id, "status", status, seq) for job_id, owner_id, seq, status, _ in entries]
