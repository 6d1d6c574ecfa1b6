"""Monitoring's own SQL: reads over the SQLite broker's tables and the write gate's shared state, and
the supervisors' ``worker_slots`` table.

Everything else the scrape needs comes from the broker's operators' API (``broker.stats()``,
``broker.processes()``); this module holds only what that API does not answer yet. Queries are
read-only, run on the broker's connection for this thread, and use the broker's partial indexes:

- ``broker_messages_leased (lease_expires) WHERE state = 1`` — expired leases are a range of it, so
  the cost is proportional to the number of *expired* leases (normally ~0), not to the table.

:func:`degraded_output_roots` reads ``output_root_health`` (the actors' write gate, shared by every
worker through the job database) for readiness health; monitoring cannot import the actors' layer, so
it reads the table by name.

``worker_slots`` (:mod:`monitoring.models`) is written by the supervisors (:mod:`tenure_cli.slot_report`)
and read by the Workers page: :func:`worker_slots_write` replaces a supervisor's rows with its current
slots (on every change and every heartbeat), :func:`worker_slots_delete` removes them when it stops,
:func:`worker_slots_prune` removes those of supervisors that stopped heartbeating (killed), and
:func:`worker_slots_live` reads the live ones.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, text

from jobs.db import read

#: A supervisor rewrites its ``worker_slots`` rows at least this often (its heartbeat).
WORKER_SLOT_HEARTBEAT_S = 10.0
#: Rows whose heartbeat is older than this belong to a supervisor that is gone (three beats missed).
WORKER_SLOT_STALE_MS = 35_000


def lease_expired_by_queue(conn: sqlite3.Connection, now_ms: int) -> dict[str, int]:
    """Leased rows whose lease expired before *now_ms* and were not returned to ready yet, per queue."""
    rows = conn.execute(
        "SELECT queue, count(*) FROM broker_messages INDEXED BY broker_messages_leased "
        "WHERE state = 1 AND lease_expires < ? GROUP BY queue",
        (now_ms,),
    ).fetchall()
    return {queue: int(n) for queue, n in rows}


def degraded_output_roots(engine: Engine) -> dict[str, str]:
    """Every output root the write gate holds degraded, with its cached error (``output_root_health``)."""
    with read(engine) as conn:
        rows = conn.execute(
            text("SELECT root, error FROM output_root_health WHERE state = 'degraded' ORDER BY root")
        ).fetchall()
    return {root: error or "" for root, error in rows}


@dataclass(frozen=True)
class WorkerSlotRow:
    """One live supervisor slot (a ``worker_slots`` row; times in epoch milliseconds)."""

    supervisor: str
    slot: int
    host: str
    supervisor_pid: int
    role: str
    state: str
    pid: int | None
    restarts: int
    crashes: int
    last_exit: str | None
    last_exit_at: int | None
    restart_at: int | None
    started_at: int
    heartbeat_at: int


_SLOT_COLUMNS = (
    "supervisor, slot, host, supervisor_pid, role, state, pid, restarts, crashes, last_exit, last_exit_at, "
    "restart_at, started_at, heartbeat_at"
)


def worker_slots_write(conn: Connection, supervisor: str, rows: Sequence[dict[str, Any]]) -> None:
    """Replace *supervisor*'s rows with *rows* (each a dict of every ``worker_slots`` column).

    Delete-then-insert in the caller's write transaction: it also brings back rows that a prune
    removed while this supervisor could not reach the database.
    """
    conn.execute(text("DELETE FROM worker_slots WHERE supervisor = :s"), {"s": supervisor})
    if rows:
        values = ", ".join(f":{c.strip()}" for c in _SLOT_COLUMNS.split(","))
        conn.execute(text(f"INSERT INTO worker_slots ({_SLOT_COLUMNS}) VALUES ({values})"), list(rows))


def worker_slots_delete(conn: Connection, supervisor: str) -> None:
    """Remove the rows of a supervisor that stopped."""
    conn.execute(text("DELETE FROM worker_slots WHERE supervisor = :s"), {"s": supervisor})


def worker_slots_prune(conn: Connection, now_ms: int) -> int:
    """Delete the rows of supervisors whose heartbeat is older than :data:`WORKER_SLOT_STALE_MS`; how many."""
    cur = conn.execute(
        text("DELETE FROM worker_slots WHERE heartbeat_at < :before"), {"before": now_ms - WORKER_SLOT_STALE_MS}
    )
    return int(cur.rowcount or 0)


def worker_slots_live(engine: Engine, now_ms: int) -> list[WorkerSlotRow]:
    """The slots of every supervisor that heartbeated within :data:`WORKER_SLOT_STALE_MS`, by role, host, slot."""
    with read(engine) as conn:
        rows = conn.execute(
            text(
                f"SELECT {_SLOT_COLUMNS} FROM worker_slots WHERE heartbeat_at >= :since "
                "ORDER BY role, host, supervisor, slot"
            ),
            {"since": now_ms - WORKER_SLOT_STALE_MS},
        ).fetchall()
    return [WorkerSlotRow(*row) for row in rows]
