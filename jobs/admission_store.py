"""The SQL of admission (:mod:`jobs.admission`): held jobs, what keys and queues have in flight, rate starts.

Every query reads one of revision 0019's partial indexes (``ix_jobs_held``, ``ix_jobs_inflight``,
``ix_jobs_concurrency_active``, ``ix_jobs_rate_active``, ``ix_rate_starts_key_started_at``), so its cost
is bounded by what is held, admitted or running, never by the size of the job table. (On SQLite a query
repeats its index's ``status IN ('queued', 'running')`` so the planner may use the partial index, and
writes its own status test as ``+status``: a plain one makes SQLite, without statistics, prefer the
status index and read every queued job.) Callers pass the
connection of their transaction (a SQLAlchemy connection, or the raw sqlite3 connection of the claim
path); :func:`lock_key` serialises the writers of one key on PostgreSQL, where SQLite's single writer
already does.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, text

from .store import _exec

#: Why a queued job waits for its message (``jobs.held``).
QUEUE = "queue"
CONCURRENCY = "concurrency"
RATE = "rate"
#: A workflow step waiting for the steps it depends on (``held_on``: the workflow's id).
STEPS = "steps"

Conn = Connection | sqlite3.Connection
#: The partial indexes' condition on live jobs, repeated by their queries (see the module docstring).
_ACTIVE = "status IN ('queued', 'running')"


@dataclass(frozen=True, slots=True)
class HeldJob:
    """What admission needs of a held job to give it its message."""

    id: str
    owner_id: str
    actor_name: str
    queue_name: str
    priority: int
    run_after: int
    created_at: int
    concurrency_key: str | None
    rate_key: str | None
    trace_context: str | None

    @classmethod
    def of(cls, job: Any, *, run_after: int | None = None, created_at: int | None = None) -> HeldJob:
        """From a job row (any with these attributes), with *run_after* / *created_at* where it has none."""
        return cls(
            job.id,
            job.owner_id,
            job.actor_name,
            job.queue_name,
            job.priority,
            job.run_after if run_after is None else run_after,
            job.created_at if created_at is None else created_at,
            job.concurrency_key,
            job.rate_key,
            job.trace_context,
        )


_HELD_COLUMNS = (
    "id, owner_id, actor_name, queue_name, priority, run_after, created_at, concurrency_key, rate_key, trace_context"
)


def _postgres(conn: Conn) -> bool:
    return getattr(getattr(conn, "dialect", None), "name", "sqlite") == "postgresql"


def _plus(conn: Conn) -> str:
    """SQLite's ``+`` before a column, which keeps the planner off that column's indexes (module docstring)."""
    return "" if _postgres(conn) else "+"


def lock_key(conn: Conn, key: str) -> None:
    """Serialise this transaction with every other one admitting, claiming or releasing *key*
    (PostgreSQL: a transaction-scoped advisory lock; SQLite's writer holds the whole file already)."""
    if _postgres(conn):
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 19))"), {"k": key})  # type: ignore[union-attr]


# -- held jobs -----------------------------------------------------------------------------------------
def hold(conn: Conn, job_id: str, held: str, on: str, now: int) -> bool:
    """A queued job with a message (or a claim that found its key full) → held; False if it is not queued."""
    cur = _exec(
        conn,
        "UPDATE jobs SET held = :held, held_on = :on, updated_at = :now WHERE id = :id AND status = 'queued'",
        {"id": job_id, "held": held, "on": on, "now": now},
    )
    return bool(cur.rowcount)


def unhold(conn: Conn, job_id: str, now: int) -> bool:
    """A held job → admitted (its message is written in the same transaction); False if it is no longer held."""
    cur = _exec(
        conn,
        "UPDATE jobs SET held = NULL, held_on = NULL, updated_at = :now "
        "WHERE id = :id AND status = 'queued' AND held IS NOT NULL",
        {"id": job_id, "now": now},
    )
    return bool(cur.rowcount)


def unhold_many(conn: Conn, held: str, on: str, job_ids: Sequence[str], now: int) -> set[str]:
    """:func:`unhold` of several jobs waiting on *on* in one statement; the ids that were unheld."""
    if not job_ids:
        return set()
    plus = _plus(conn)
    marks = ", ".join(f":i{n}" for n in range(len(job_ids)))
    rows = _exec(
        conn,
        "UPDATE jobs SET held = NULL, held_on = NULL, updated_at = :now "
        # ``+held``: by id, not by a range of every held job of the queue (SQLite's planner would pick that).
        f"WHERE id IN ({marks}) AND {plus}held = :held AND {plus}held_on = :on RETURNING id",
        {"now": now, "held": held, "on": on, **{f"i{n}": job_id for n, job_id in enumerate(job_ids)}},
    ).fetchall()
    return {r[0] for r in rows}


def held_exists(conn: Conn, held: str, on: str) -> bool:
    row = _exec(conn, "SELECT 1 FROM jobs WHERE held = :held AND held_on = :on LIMIT 1", {"held": held, "on": on})
    return row.fetchone() is not None


def held_owners(conn: Conn, held: str, on: str, limit: int) -> list[str]:
    """The owners with jobs held on *on*, at most *limit*: a skip scan of ``ix_jobs_held``, one index
    descent per owner however many jobs each holds."""
    rows = _exec(
        conn,
        "WITH RECURSIVE o(owner_id) AS ("
        " SELECT min(owner_id) FROM jobs WHERE held = :held AND held_on = :on"
        " UNION ALL"
        " SELECT (SELECT min(j.owner_id) FROM jobs j WHERE j.held = :held AND j.held_on = :on"
        "         AND j.owner_id > o.owner_id)"
        " FROM o WHERE o.owner_id IS NOT NULL"
        ") SELECT owner_id FROM o WHERE owner_id IS NOT NULL LIMIT :limit",
        {"held": held, "on": on, "limit": limit},
    ).fetchall()
    return [r[0] for r in rows]


def held_next(conn: Conn, held: str, on: str, owner_id: str, limit: int, after: HeldJob | None = None) -> list[HeldJob]:
    """*owner_id*'s jobs held on *on* in admission order (highest priority, then oldest), after *after*."""
    params: dict[str, Any] = {"held": held, "on": on, "owner": owner_id, "limit": limit}
    page = ""
    if after is not None:
        # The row comparison of the index order with priority descending, spelled out.
        page = (
            " AND (priority < :p OR (priority = :p AND (run_after > :r OR (run_after = :r AND "
            "(created_at > :c OR (created_at = :c AND id > :i))))))"
        )
        params.update(p=after.priority, r=after.run_after, c=after.created_at, i=after.id)
    # On PostgreSQL, rows another transaction is admitting are skipped, not waited for: two workers
    # refilling a window at once admit different jobs instead of queueing on the same rows.
    lock = " FOR UPDATE SKIP LOCKED" if _postgres(conn) else ""
    rows = _exec(
        conn,
        f"SELECT {_HELD_COLUMNS} FROM jobs WHERE held = :held AND held_on = :on AND owner_id = :owner{page} "
        f"ORDER BY priority DESC, run_after, created_at, id LIMIT :limit{lock}",
        params,
    ).fetchall()
    return [HeldJob(*r) for r in rows]


def held_counts(conn: Conn) -> list[tuple[str, str, int]]:
    """``(held, held_on, jobs)`` of every held group (the collectors' and the Queues page's counts)."""
    rows = _exec(
        conn, "SELECT held, held_on, count(*) FROM jobs WHERE held IS NOT NULL GROUP BY held, held_on", {}
    ).fetchall()
    return [(r[0], r[1], int(r[2])) for r in rows]


def waiting_by_queue(conn: Conn) -> list[tuple[str, str, int]]:
    """``(queue, held, jobs)`` of the waiting jobs."""
    rows = _exec(
        conn,
        "SELECT queue_name, held, count(*) FROM jobs WHERE held IS NOT NULL GROUP BY queue_name, held",
        {},
    ).fetchall()
    return [(r[0], r[1], int(r[2])) for r in rows]


def running_by_key(conn: Conn) -> dict[str, int]:
    """Running jobs per concurrency key (keys with none are absent)."""
    rows = _exec(
        conn,
        "SELECT concurrency_key, count(*) FROM jobs WHERE concurrency_key IS NOT NULL AND held IS NULL "
        "AND status = 'running' GROUP BY concurrency_key",
        {},
    ).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def rate_starts_by_key(conn: Conn, since: int) -> list[tuple[str, int]]:
    """``(key, started_at)`` of every start after *since*."""
    rows = _exec(conn, "SELECT key, started_at FROM rate_starts WHERE started_at > :since", {"since": since})
    return [(r[0], int(r[1])) for r in rows.fetchall()]


# -- what queues and keys have in flight ---------------------------------------------------------------
#: Whether some job waits for queue ``:q``'s window (``:held`` is :data:`QUEUE`).
_WINDOW_WAITED_FOR = "EXISTS (SELECT 1 FROM jobs WHERE held = :held AND held_on = :q)"


def _admitted_due_sql(plus: str) -> str:
    """Admitted jobs of queue ``:q`` that may start now (their messages are ready), counted up to ``:cap``
    (from the index alone)."""
    return (
        "(SELECT count(*) FROM (SELECT 1 FROM jobs WHERE queue_name = :q AND held IS NULL "
        f"AND {_ACTIVE} AND {plus}status = 'queued' AND run_after <= :now LIMIT :cap) AS due)"
    )


def _window_full_sql(conn: Conn) -> str:
    """1 when a job of queue ``:q`` must wait for its window (see :func:`queue_window_full`), else 0."""
    return (
        f"CASE WHEN {_WINDOW_WAITED_FOR} THEN 1 "
        f"WHEN {_admitted_due_sql(_plus(conn))} - :counted >= :window THEN 1 ELSE 0 END"
    )


def _window_params(queue: str, now: int, window: int, counted: int) -> dict[str, Any]:
    return {"held": QUEUE, "q": queue, "now": now, "cap": window + counted, "counted": counted, "window": window}


def queue_window_full(conn: Conn, queue: str, now: int, window: int, counted: int) -> bool:
    """Whether a job of *queue* must wait for the queue's window: jobs wait for it already, or *window*
    admitted jobs other than the job itself may start now (*counted*: 1 when the job is among them). One
    statement, which counts only when nobody waits."""
    row = _exec(conn, f"SELECT {_window_full_sql(conn)}", _window_params(queue, now, window, counted)).fetchone()
    return bool(row[0])


def queue_window_room(conn: Conn, queue: str, now: int, window: int) -> int | None:
    """The free places of *queue*'s window (*window* less the admitted jobs that may start now), or None
    when no job waits for it (nothing to refill). One statement, which counts only when some wait."""
    row = _exec(
        conn,
        f"SELECT CASE WHEN {_WINDOW_WAITED_FOR} THEN {_admitted_due_sql(_plus(conn))} END",
        {"held": QUEUE, "q": queue, "now": now, "cap": window},
    ).fetchone()
    return None if row[0] is None else window - int(row[0])


def queue_inflight(conn: Conn, queue: str, owners: Sequence[str]) -> dict[str, int]:
    """Admitted and running jobs of *queue* per owner among *owners* (the fair-share counts)."""
    return _grouped(
        conn,
        "SELECT owner_id, count(*) FROM jobs WHERE queue_name = :on AND owner_id IN :owners "
        f"AND held IS NULL AND {_ACTIVE} GROUP BY owner_id",
        queue,
        owners,
    )


def key_inflight(conn: Conn, key: str, owners: Sequence[str]) -> dict[str, int]:
    """Admitted and running jobs of concurrency key *key* per owner among *owners*."""
    return _grouped(
        conn,
        "SELECT owner_id, count(*) FROM jobs WHERE concurrency_key = :on AND owner_id IN :owners "
        f"AND held IS NULL AND {_ACTIVE} GROUP BY owner_id",
        key,
        owners,
    )


def rate_key_admitted_by_owner(conn: Conn, key: str, owners: Sequence[str]) -> dict[str, int]:
    """Admitted jobs of rate key *key* per owner among *owners*."""
    plus = _plus(conn)
    return _grouped(
        conn,
        "SELECT owner_id, count(*) FROM jobs WHERE rate_key = :on AND owner_id IN :owners "
        f"AND held IS NULL AND {_ACTIVE} AND {plus}status = 'queued' GROUP BY owner_id",
        key,
        owners,
    )


_EXPANDING: dict[str, Any] = {}


def _grouped(conn: Conn, sql: str, on: str, owners: Sequence[str]) -> dict[str, int]:
    if isinstance(conn, sqlite3.Connection):
        marks = ", ".join("?" for _ in owners)
        rows = conn.execute(sql.replace(":on", "?").replace(":owners", f"({marks})"), (on, *owners)).fetchall()
    else:
        stmt = _EXPANDING.get(sql)
        if stmt is None:
            stmt = _EXPANDING[sql] = text(sql).bindparams(bindparam("owners", expanding=True))
        rows = conn.execute(stmt, {"on": on, "owners": list(owners)}).fetchall()
    return {r[0]: int(r[1]) for r in rows}


_KEY_ACTIVE = (
    "SELECT coalesce(sum(CASE WHEN status = 'running' THEN 1 ELSE 0 END), 0), "
    "coalesce(sum(CASE WHEN status = 'queued' AND run_after <= :now THEN 1 ELSE 0 END), 0){also} "
    f"FROM jobs WHERE concurrency_key = :key AND held IS NULL AND {_ACTIVE}"
)


def key_active(conn: Conn, key: str, now: int) -> tuple[int, int]:
    """``(running, admitted and due)`` jobs of concurrency key *key*."""
    row = _exec(conn, _KEY_ACTIVE.format(also=""), {"key": key, "now": now}).fetchone()
    return int(row[0]), int(row[1])


def key_active_and_window_full(
    conn: Conn, key: str, queue: str, now: int, window: int, counted: int
) -> tuple[int, int, bool]:
    """:func:`key_active` of *key* and :func:`queue_window_full` of *queue* in one statement: a keyed job's
    submit under fair share asks both. (When the key is full the window's answer goes unused: an index
    probe, cheaper than a round trip.)"""
    row = _exec(
        conn,
        _KEY_ACTIVE.format(also=f", ({_window_full_sql(conn)})"),
        {"key": key, **_window_params(queue, now, window, counted)},
    ).fetchone()
    return int(row[0]), int(row[1]), bool(row[2])


def key_running(conn: Conn, key: str) -> int:
    plus = _plus(conn)
    row = _exec(
        conn,
        f"SELECT count(*) FROM jobs WHERE concurrency_key = :key AND held IS NULL AND {_ACTIVE} "
        f"AND {plus}status = 'running'",
        {"key": key},
    ).fetchone()
    return int(row[0])


def rate_admitted(conn: Conn, key: str) -> int:
    """Admitted (not yet started) jobs of rate key *key*."""
    plus = _plus(conn)
    row = _exec(
        conn,
        f"SELECT count(*) FROM jobs WHERE rate_key = :key AND held IS NULL AND {_ACTIVE} AND {plus}status = 'queued'",
        {"key": key},
    ).fetchone()
    return int(row[0])


# -- the messages a broker should hold (jobs.redelivery) -------------------------------------------------
def messages_expected(conn: Conn, workflow_worker: str) -> dict[str, int]:
    """Per queue, the messages its broker should hold: one per admitted queued job and one per running job
    (delivered, not acked yet); a workflow parent (run by *workflow_worker*) has none."""
    rows = _exec(
        conn,
        f"SELECT queue_name, count(*) FROM jobs WHERE held IS NULL AND {_ACTIVE} "
        "AND (worker_id IS NULL OR worker_id <> :workflow) GROUP BY queue_name",
        {"workflow": workflow_worker},
    ).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def admitted_oldest(conn: Conn, queue: str, admitted_before: int, limit: int) -> list[HeldJob]:
    """The oldest admitted queued jobs of *queue* last moved before *admitted_before*, at most *limit*."""
    plus = _plus(conn)
    rows = _exec(
        conn,
        f"SELECT {_HELD_COLUMNS} FROM jobs WHERE queue_name = :q AND held IS NULL AND {_ACTIVE} "
        f"AND {plus}status = 'queued' AND updated_at < :before ORDER BY run_after, created_at, id LIMIT :limit",
        {"q": queue, "before": admitted_before, "limit": limit},
    ).fetchall()
    return [HeldJob(*r) for r in rows]


# -- rate starts ---------------------------------------------------------------------------------------
def rate_starts_since(conn: Conn, key: str, since: int) -> list[int]:
    """Start times of *key* after *since*, oldest first."""
    rows = _exec(
        conn,
        "SELECT started_at FROM rate_starts WHERE key = :key AND started_at > :since ORDER BY started_at",
        {"key": key, "since": since},
    ).fetchall()
    return [int(r[0]) for r in rows]


def rate_start_insert(conn: Conn, key: str, at: int) -> None:
    _exec(conn, "INSERT INTO rate_starts (key, started_at) VALUES (:key, :at)", {"key": key, "at": at})


def rate_starts_prune(conn: Conn, before: int) -> int:
    """Forget starts older than *before* (no rate limit looks further back)."""
    return int(_exec(conn, "DELETE FROM rate_starts WHERE started_at < :before", {"before": before}).rowcount or 0)
