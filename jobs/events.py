"""Appending job events inside the caller's transaction.

Every job event is a row of ``job_events`` whose ``sequence`` was reserved on the job row by the same
transaction (so sequences are unique and gap-free per job). Writing an event has no other effect:
what a status change sets in motion (a workflow moving on, lifecycle metrics) is the business of the
transition that makes it (:mod:`jobs.transitions`).
"""

from __future__ import annotations

from typing import Any

from . import store
from .db import Tx


def record(tx: Tx, *, job_id: str, sequence: int, type_: str, data: dict[str, Any], now: int) -> None:
    """Insert event *sequence* (already reserved on the job row)."""
    store.event_insert(tx.conn, job_id, sequence, type_, store.dumps(data), now)


def status_event(tx: Tx, *, job_id: str, sequence: int, status: str, now: int, **data: Any) -> None:
    """The event every status change writes: ``{"status": …, …}``."""
    record(tx, job_id=job_id, sequence=sequence, type_="status", data={"status": status, **data}, now=now)


def status_events_many(conn: Any, now: int, entries: list[tuple[str, int, str, dict[str, Any]]]) -> None:
    """:func:`status_event` for several jobs in one statement (SQLite, a raw connection).

    *entries*: ``(job_id, sequence, status, data)``."""
    store.event_insert_many(
        conn,
        [
            (job_id, seq, "status", store.dumps({"status": status, **data}), now)
            for job_id, seq, status, data in entries
        ],
    )
