"""All SQL of the job layer, one method per query.

Tables (see ``jobs/models.py`` and ``migrations/``):

- ``jobs`` — one row per job: identity (owner, kind, resource, idempotency key, request digest),
  the payload and config snapshot, ``status``/``attempt``/``worker_id``/``lease_expires_at``,
  progress, result or error, ``cancel_requested_at``, and ``event_seq`` (the last event sequence).
- ``job_events`` — ``(job_id, sequence)`` rows; ``sequence`` comes from ``jobs.event_seq``, which is
  incremented in the same statement/transaction that writes the event, so sequences are unique and
  gap-free (a rolled-back transaction rolls the counter back too).
- ``idempotency`` — ``(owner_id, kind, key) → (request_digest, job_id)``.
- ``outbox`` — broker messages to publish after commit when the broker is not SQLite on the same file.
- ``job_dependencies`` — workflow edges.

The read side (lists, search, counts, activity, the change feed) is :mod:`jobs.read_store`.

Invariants the queries keep (CHECKs enforce the static ones, see ``jobs/models.py``):

- every write made by an execution is guarded by ``status = 'running' AND attempt = :attempt AND
  worker_id = :worker`` (:data:`CURRENT`); a write that matches nothing returns ``None``/``False``
  and the caller raises :class:`jobs.errors.StaleAttempt`;
- a terminal row is never updated again (every transition names the status it starts from);
- a job with a cancel request can no longer succeed or be requeued (the guards say so), so
  whichever of cancel and result publication commits first wins;
- claims increment ``attempt``; nothing else does.

Callers pass the connection, so several queries share one transaction. Timestamps are integer
milliseconds.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import Connection, bindparam, text

#: The execution guard shared by every write an attempt makes.
CURRENT = "id = :id AND status = 'running' AND attempt = :attempt AND worker_id = :worker"


def now_ms() -> int:
    return int(time.time() * 1000)


#: One encoder for every call (``json.dumps`` with options builds a new encoder each time).
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def dumps(value: Any) -> str:
    """Canonical JSON (sorted keys, no spaces): equal documents give equal text and digests."""
    return _ENCODER.encode(value)


def _for_update(conn: Connection | sqlite3.Connection, *, skip_locked: bool = False) -> str:
    # SQLite has no row locks: its callers already hold the database write lock (BEGIN IMMEDIATE).
    if getattr(getattr(conn, "dialect", None), "name", "sqlite") == "postgresql":
        return " FOR UPDATE SKIP LOCKED" if skip_locked else " FOR UPDATE"
    return ""


JOB_COLUMNS = (
    "id, owner_id, kind, actor_name, queue_name, resource_type, resource_id, idempotency_key, request_digest, "
    "payload, config, priority, status, attempt, max_attempts, timeout_s, safe_to_rerun, worker_id, "
    "lease_expires_at, run_after, progress, progress_message, result, error, cancel_requested_at, event_seq, "
    "created_at, updated_at, started_at, completed_at, retry_of_job_id, parent_job_id, summary, trace_context, "
    "concurrency_key, rate_key, held, held_on"
)


# Not frozen: a frozen dataclass's __init__ sets each of these 38 fields through object.__setattr__ (4.6 µs a row
# against 0.4 µs with slots), and a claim builds one per job in the ack writer, the thread every job waits for.
@dataclass(slots=True)
class JobRow:
    """A full ``jobs`` row (internal: the public record is :class:`jobs.records.JobRecord`)."""

    id: str
    owner_id: str
    kind: str
    actor_name: str
    queue_name: str
    resource_type: str | None
    resource_id: str | None
    idempotency_key: str | None
    request_digest: str
    payload: str
    config: str
    priority: int
    status: str
    attempt: int
    max_attempts: int
    timeout_s: int
    safe_to_rerun: bool
    worker_id: str | None
    lease_expires_at: int | None
    run_after: int
    progress: float | None
    progress_message: str | None
    result: str | None
    error: str | None
    cancel_requested_at: int | None
    event_seq: int
    created_at: int
    updated_at: int
    started_at: int | None
    completed_at: int | None
    retry_of_job_id: str | None
    parent_job_id: str | None
    summary: str | None
    #: The submit's W3C trace context (JSON) when it was traced: a message written later carries it.
    trace_context: str | None = None
    #: Its keys under its kind's concurrency and rate limits (``<limit>=<value>``; :mod:`jobs.limits`).
    concurrency_key: str | None = None
    rate_key: str | None = None
    #: Why a queued job waits for its message, and on what (:mod:`jobs.admission`); None when it has one.
    held: str | None = None
    held_on: str | None = None


@dataclass(frozen=True)
class EventRow:
    job_id: str
    sequence: int
    type: str
    data: str
    created_at: int


@dataclass(frozen=True)
class ExpiredJob:
    id: str
    owner_id: str
    kind: str
    parent_job_id: str | None
    actor_name: str
    queue_name: str
    priority: int
    attempt: int
    max_attempts: int
    worker_id: str
    safe_to_rerun: bool
    cancel_requested: bool
    #: When the lease ran out (ms epoch).
    lease_expires_at: int
    #: ``jobs.trace_context``: the submit's trace context (JSON), if it was traced.
    trace_context: str | None
    concurrency_key: str | None = None
    rate_key: str | None = None


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """A message to write to the outbox: *eta* in ms epoch."""

    message_id: str
    job_id: str | None
    queue_name: str
    actor_name: str
    body: bytes
    eta: int


@dataclass(frozen=True)
class OutboxRow:
    id: int
    message_id: str
    queue_name: str
    actor_name: str
    body: bytes
    eta: int


def _job(row: Any) -> JobRow | None:
    if row is None:
        return None
    values = list(row)
    values[16] = bool(values[16])
    return JobRow(*values)


_SQL: dict[str, Any] = {}


def _q(sql: str) -> Any:
    stmt = _SQL.get(sql)
    if stmt is None:
        stmt = _SQL[sql] = text(sql)
    return stmt


_QMARK: dict[str, tuple[str, tuple[str, ...]]] = {}
_NAMED = re.compile(r":(\w+)")


def _positional(sql: str) -> tuple[str, tuple[str, ...]]:
    """*sql* with its ``:name`` parameters as ``?`` and the names in order (cached per statement)."""
    found = _QMARK.get(sql)
    if found is None:
        found = (_NAMED.sub("?", sql), tuple(_NAMED.findall(sql)))
        _QMARK[sql] = found
    return found


def _postgres(conn: Connection | sqlite3.Connection) -> bool:
    return not isinstance(conn, sqlite3.Connection) and conn.dialect.name == "postgresql"


def _exec(conn: Connection | sqlite3.Connection, sql: str, params: dict[str, Any]) -> Any:
    """Run *sql* on a SQLAlchemy connection, or directly on the raw sqlite3 connection of the hot path
    (:func:`jobs.db.fast_write`).

    On the raw connection the ``:name`` parameters are bound by position: Python 3.11's sqlite3
    releases the GIL around the lookup of every named parameter, and on a worker process's busy
    threads each release is a hand-off."""
    if isinstance(conn, sqlite3.Connection):
        text, names = _positional(sql)
        return conn.execute(text, tuple(params[name] for name in names))
    return conn.execute(_q(sql), params)


# -- jobs: submit and read --------------------------------------------------------------------------
def job_insert(conn: Connection, row: dict[str, Any]) -> None:
    """Insert a new job (``row`` has every column but ``event_seq``, which starts at 1 for 'queued')."""
    conn.execute(
        _q(
            "INSERT INTO jobs (id, owner_id, kind, actor_name, queue_name, resource_type, resource_id, "
            "idempotency_key, request_digest, payload, config, priority, status, attempt, max_attempts, timeout_s, "
            "safe_to_rerun, run_after, event_seq, created_at, updated_at, retry_of_job_id, parent_job_id, summary, "
            "trace_context, concurrency_key, rate_key, held, held_on) "
            "VALUES (:id, :owner_id, :kind, :actor_name, :queue_name, :resource_type, :resource_id, :idempotency_key, "
            ":request_digest, :payload, :config, :priority, 'queued', 0, :max_attempts, :timeout_s, :safe_to_rerun, "
            ":run_after, 1, :created_at, :created_at, :retry_of_job_id, :parent_job_id, :summary, :trace_context, "
            ":concurrency_key, :rate_key, :held, :held_on)"
        ),
        row,
    )


def job_get(conn: Connection, job_id: str) -> JobRow | None:
    return _job(conn.execute(_q(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = :id"), {"id": job_id}).fetchone())


def job_get_for_update(conn: Connection, job_id: str) -> JobRow | None:
    """The job, row-locked on PostgreSQL until the transaction ends."""
    sql = f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = :id" + _for_update(conn)
    return _job(conn.execute(_q(sql), {"id": job_id}).fetchone())


def job_count_running_created_before(conn: Connection, before_ms: int) -> int:
    """Running jobs submitted before *before_ms* (they hold a config snapshot older than that moment)."""
    return int(
        conn.execute(
            _q("SELECT count(*) FROM jobs WHERE status = 'running' AND created_at < :t"), {"t": before_ms}
        ).scalar_one()
    )


def job_count_by_status(conn: Connection) -> dict[str, int]:
    return dict(conn.execute(_q("SELECT status, count(*) FROM jobs GROUP BY status")).fetchall())


# -- jobs: execution (every write guarded by CURRENT) ------------------------------------------------
#: The claim's writes and guard (:func:`job_claim`, :func:`job_claim_many`); ``{status}`` is the column as
#: the planner may use it (``+status`` hides it from the index choice; SQLite only).
_CLAIM = (
    "UPDATE jobs SET status = 'running', attempt = attempt + 1, worker_id = :worker, "
    "lease_expires_at = :expires, started_at = :now, updated_at = :now, progress = NULL, "
    "progress_message = NULL, event_seq = event_seq + 1 "
    "WHERE {ids} AND attempt < max_attempts AND {status} = 'queued' AND held IS NULL "
)


def job_claim(
    conn: Connection | sqlite3.Connection, job_id: str, worker: str, now: int, lease_ms: int
) -> JobRow | None:
    """queued → running (attempt + 1).

    Matches nothing when the job is not queued or out of attempts. A job running under an expired lease
    is recovered first (:func:`jobs.recovery.recover_in`: its lost attempt is recorded), then claimed.
    """
    row = _exec(
        conn,
        _CLAIM.format(ids="id = :id", status="status") + f"RETURNING {JOB_COLUMNS}",
        {"id": job_id, "worker": worker, "expires": now + lease_ms, "now": now},
    ).fetchone()
    return _job(row)


def job_claim_many(
    conn: Connection | sqlite3.Connection, job_ids: list[str], worker: str, now: int, lease_ms: int
) -> dict[str, JobRow]:
    """:func:`job_claim` for several jobs in one statement: the claimed rows by id.

    The guard is :func:`job_claim`'s, row by row; ids that match nothing are absent."""
    if _postgres(conn):
        # PostgreSQL reads the ids in index order, so two batches lock the rows they share in one order.
        rows = conn.execute(
            _q(_CLAIM.format(ids="id = ANY(:ids)", status="status") + f"RETURNING {JOB_COLUMNS}"),
            {"ids": list(job_ids), "worker": worker, "expires": now + lease_ms, "now": now},
        ).fetchall()
        return {job.id: job for job in map(_job, rows) if job is not None}
    ids = {f"id{i}": job_id for i, job_id in enumerate(job_ids)}
    rows = _exec(
        conn,
        # ``+status``: a plain term lets SQLite's planner prefer a MULTI-INDEX OR over the status index
        # once the id list is long, reading every queued job; ``+`` leaves it the id lookups.
        _CLAIM.format(ids=f"id IN ({', '.join(':' + k for k in ids)})", status="+status")
        # One JSON column, not 32: Python 3.11's sqlite3 releases the GIL around every column it reads
        # (sqlite3_column_type), and each release is a GIL hand-off to a busy worker thread.
        + f"RETURNING json_array({JOB_COLUMNS})",
        {**ids, "worker": worker, "expires": now + lease_ms, "now": now},
    ).fetchall()
    claimed = [_job(json.loads(row[0])) for row in rows]
    return {job.id: job for job in claimed if job is not None}


_COMPLETE_MANY = (
    # v's columns (both engines name them columnN): id, attempt, worker, result, progress message.
    "UPDATE jobs SET status = 'succeeded', result = v.column4, error = NULL, progress = 1.0, "
    "progress_message = coalesce(v.column5, jobs.progress_message), worker_id = NULL, "
    "lease_expires_at = NULL, completed_at = {now}, updated_at = {now}, event_seq = jobs.event_seq + 1 "
    "FROM (VALUES {values}) AS v WHERE jobs.id = v.column1 AND {status} = 'running' "
    "AND jobs.attempt = v.column2 AND jobs.worker_id = v.column3 AND jobs.cancel_requested_at IS NULL "
    "RETURNING jobs.id, jobs.event_seq"
)


def job_complete_many(
    conn: Connection | sqlite3.Connection,
    completions: list[tuple[str, int, str, str | None, str | None]],
    now: int,
) -> dict[str, int]:
    """:func:`job_complete_if_current` for several attempts in one statement.

    *completions*: ``(job_id, attempt, worker, result, progress_message)``. Returns the status event's
    sequence by job id for the attempts that were completed; the others (stale, or a cancel request
    committed first) are absent and untouched."""
    if not isinstance(conn, sqlite3.Connection):
        postgres = _postgres(conn)
        # Typed on PostgreSQL, which reads untyped parameters in VALUES as text.
        row = "(:i{n}, CAST(:a{n} AS INTEGER), :w{n}, CAST(:r{n} AS TEXT), CAST(:m{n} AS TEXT))"
        params: dict[str, Any] = {"now": now}
        for n, (job_id, attempt, worker, result, message) in enumerate(completions):
            params.update({f"i{n}": job_id, f"a{n}": attempt, f"w{n}": worker, f"r{n}": result, f"m{n}": message})
        sql = _COMPLETE_MANY.format(
            now=":now",
            values=",".join(row.format(n=n) for n in range(len(completions))),
            status="jobs.status" if postgres else "+jobs.status",
        )
        return {r[0]: int(r[1]) for r in conn.execute(_q(sql), params).fetchall()}
    rows = conn.execute(
        _COMPLETE_MANY.format(now="?", values=",".join("(?,?,?,?,?)" for _ in completions), status="+jobs.status"),
        (now, now, *(value for completion in completions for value in completion)),
    ).fetchall()
    return {row[0]: int(row[1]) for row in rows}


def job_lease_renew_if_current(
    conn: Connection | sqlite3.Connection, job_id: str, attempt: int, worker: str, expires: int
) -> bool:
    cur = _exec(
        conn,
        (f"UPDATE jobs SET lease_expires_at = :expires WHERE {CURRENT}"),
        {"id": job_id, "attempt": attempt, "worker": worker, "expires": expires},
    )
    return cur.rowcount == 1


def job_check_current(
    conn: Connection | sqlite3.Connection, job_id: str, attempt: int, worker: str
) -> tuple[bool, bool]:
    """``(current, cancel_requested)`` of this attempt (a plain read)."""
    row = _exec(
        conn,
        (f"SELECT cancel_requested_at FROM jobs WHERE {CURRENT}"),
        {"id": job_id, "attempt": attempt, "worker": worker},
    ).fetchone()
    return (False, False) if row is None else (True, row[0] is not None)


def job_check_current_for_update(
    conn: Connection | sqlite3.Connection, job_id: str, attempt: int, worker: str
) -> tuple[bool, bool]:
    """As :func:`job_check_current`, row-locked on PostgreSQL (SQLite callers hold the write lock)."""
    row = _exec(
        conn,
        f"SELECT cancel_requested_at FROM jobs WHERE {CURRENT}" + _for_update(conn),
        {"id": job_id, "attempt": attempt, "worker": worker},
    ).fetchone()
    return (False, False) if row is None else (True, row[0] is not None)


def job_progress_if_current(
    conn: Connection | sqlite3.Connection,
    job_id: str,
    attempt: int,
    worker: str,
    fraction: float | None,
    message: str | None,
    now: int,
) -> bool:
    """Record progress; False when this attempt is no longer current (nothing was written)."""
    cur = _exec(
        conn,
        (
            "UPDATE jobs SET progress = coalesce(:fraction, progress), progress_message = :message, "
            f"updated_at = :now WHERE {CURRENT}"
        ),
        {"id": job_id, "attempt": attempt, "worker": worker, "fraction": fraction, "message": message, "now": now},
    )
    return cur.rowcount == 1


def job_event_seq_next_if_current(
    conn: Connection | sqlite3.Connection, job_id: str, attempt: int, worker: str
) -> int | None:
    """Reserve the next event sequence for this attempt (None when stale)."""
    row = _exec(
        conn,
        (f"UPDATE jobs SET event_seq = event_seq + 1 WHERE {CURRENT} RETURNING event_seq"),
        {"id": job_id, "attempt": attempt, "worker": worker},
    ).fetchone()
    return None if row is None else int(row[0])


#: Every status move's UPDATE: ``{sets}`` are the move's own columns, ``{guard}`` the state it starts
#: from; each move also stamps ``updated_at`` and reserves the sequences of its events (``{events}``: its
#: status event, and a recovery's ``lease_expired`` before it).
_MOVE = "UPDATE jobs SET {sets}, updated_at = :now, event_seq = event_seq + {events} WHERE {guard} RETURNING event_seq"
#: The columns every move into a final status sets (the CHECKs: no lease, a completion time).
_FINISH = "status = :status, worker_id = NULL, lease_expires_at = NULL, completed_at = :now"
#: What a queued job's move out of ``queued`` also clears: its wait for admission (the held CHECK).
_UNHOLD = ", held = NULL, held_on = NULL"


def _move(
    conn: Connection | sqlite3.Connection, sets: str, guard: str, params: dict[str, Any], *, events: int = 1
) -> int | None:
    """Run one move; the last of the *events* sequences it reserved (None: its guard matched nothing)."""
    row = _exec(conn, _MOVE.format(sets=sets, guard=guard, events=events), params).fetchone()
    return None if row is None else int(row[0])


def job_complete_if_current(
    conn: Connection | sqlite3.Connection,
    job_id: str,
    attempt: int,
    worker: str,
    result: str | None,
    now: int,
    progress_message: str | None = None,
) -> int | None:
    """running → succeeded unless a cancel was requested; returns the status event's sequence.

    *progress_message*, when given, is the attempt's last status line not yet written (see
    ``JobContext.progress``)."""
    return _move(
        conn,
        _FINISH + ", result = :result, error = NULL, progress = 1.0, progress_message = coalesce(:message, "
        "progress_message)",
        f"{CURRENT} AND cancel_requested_at IS NULL",
        {
            "id": job_id,
            "attempt": attempt,
            "worker": worker,
            "status": "succeeded",
            "result": result,
            "now": now,
            "message": progress_message,
        },
    )


def job_finish_if_current(
    conn: Connection | sqlite3.Connection,
    job_id: str,
    attempt: int,
    worker: str,
    status: str,
    error: str | None,
    now: int,
) -> int | None:
    """running → failed or cancelled (by the execution itself); returns the status event's sequence."""
    return _move(
        conn,
        _FINISH + ", error = :error",
        CURRENT,
        {"id": job_id, "attempt": attempt, "worker": worker, "status": status, "error": error, "now": now},
    )


def job_requeue_for_retry(
    conn: Connection, job_id: str, attempt: int, worker: str, error: str, run_after: int, now: int
) -> int | None:
    """running → queued for the next attempt (not when out of attempts or cancel-requested)."""
    return _move(
        conn,
        "status = 'queued', error = :error, worker_id = NULL, lease_expires_at = NULL, run_after = :run_after",
        f"{CURRENT} AND attempt < max_attempts AND cancel_requested_at IS NULL",
        {"id": job_id, "attempt": attempt, "worker": worker, "error": error, "run_after": run_after, "now": now},
    )


# -- jobs: control (cancel, unknown kinds) ----------------------------------------------------------
def job_cancel_queued(conn: Connection, job_id: str, now: int) -> int | None:
    """queued → cancelled at once; returns the status event's sequence."""
    return _move(
        conn, _FINISH + _UNHOLD, "id = :id AND status = 'queued'", {"id": job_id, "status": "cancelled", "now": now}
    )


def job_request_cancel(conn: Connection, job_id: str, now: int) -> int | None:
    """Mark a running job's cancel request (first request wins); returns the event's sequence."""
    return _move(
        conn,
        "cancel_requested_at = :now",
        "id = :id AND status = 'running' AND cancel_requested_at IS NULL",
        {"id": job_id, "now": now},
    )


def job_fail_queued(conn: Connection, job_id: str, error: str, now: int) -> int | None:
    """queued → failed without running (a message for a kind this worker cannot run)."""
    return _move(
        conn,
        _FINISH + _UNHOLD + ", error = :error",
        "id = :id AND status = 'queued'",
        {"id": job_id, "status": "failed", "error": error, "now": now},
    )


# -- jobs: recovery of expired leases ----------------------------------------------------------------
def job_list_expired(
    conn: Connection, now: int, limit: int, *, job_id: str | None = None, queues: list[str] | None = None
) -> list[ExpiredJob]:
    """Running jobs whose lease expired before *now*, optionally of one job or of some queues only.

    Row-locked, skipping rows another transaction holds, on PostgreSQL.
    """
    sql = (
        "SELECT id, owner_id, kind, parent_job_id, actor_name, queue_name, priority, attempt, max_attempts, worker_id, "
        "safe_to_rerun, cancel_requested_at IS NOT NULL, lease_expires_at, trace_context, concurrency_key, rate_key "
        "FROM jobs "
        "WHERE status = 'running' AND lease_expires_at < :now"
    )
    params: dict[str, Any] = {"now": now, "limit": limit}
    if job_id is not None:
        sql += " AND id = :id"
        params["id"] = job_id
    if queues is not None:
        sql += " AND queue_name IN :queues"
        params["queues"] = list(queues) or [""]
    sql += " ORDER BY lease_expires_at LIMIT :limit" + _for_update(conn, skip_locked=True)
    stmt = _SQL.get(sql)
    if stmt is None:
        stmt = text(sql)
        if queues is not None:
            stmt = stmt.bindparams(bindparam("queues", expanding=True))
        _SQL[sql] = stmt
    rows = conn.execute(stmt, params).fetchall()
    return [ExpiredJob(*r[:10], bool(r[10]), bool(r[11]), int(r[12]), *r[13:]) for r in rows]


def job_recover_requeue(conn: Connection, job_id: str, attempt: int, worker: str, now: int) -> int | None:
    """Expired running → queued (next attempt on the next claim); guarded on the expired lease.

    Reserves two event sequences (the ``lease_expired`` event's, then the status event's: returned)."""
    return _move(
        conn,
        "status = 'queued', worker_id = NULL, lease_expires_at = NULL, run_after = :now",
        f"{CURRENT} AND lease_expires_at < :now AND cancel_requested_at IS NULL AND attempt < max_attempts",
        {"id": job_id, "attempt": attempt, "worker": worker, "now": now},
        events=2,
    )


def job_recover_finish(
    conn: Connection, job_id: str, attempt: int, worker: str, status: str, error: str | None, now: int
) -> int | None:
    """Expired running → cancelled / interrupted / failed; guarded on the expired lease.

    Reserves two event sequences, as :func:`job_recover_requeue`."""
    return _move(
        conn,
        _FINISH + ", error = :error",
        f"{CURRENT} AND lease_expires_at < :now",
        {"id": job_id, "attempt": attempt, "worker": worker, "status": status, "error": error, "now": now},
        events=2,
    )


# -- events ------------------------------------------------------------------------------------------
#: An event carries its job's owner (revision 0018: one owner's change feed is an index range); the
#: job row is already locked by the transaction that reserved the event's sequence.
_EVENT_OWNER = "(SELECT owner_id FROM jobs WHERE id = {job})"


def event_insert(
    conn: Connection | sqlite3.Connection, job_id: str, sequence: int, type_: str, data: str, now: int
) -> None:
    _exec(
        conn,
        (
            "INSERT INTO job_events (job_id, sequence, type, data, created_at, owner_id) "
            f"VALUES (:job_id, :sequence, :type, :data, :now, {_EVENT_OWNER.format(job=':owner_of')})"
        ),
        # The id bound twice under two names: PostgreSQL deduces one type per parameter and use.
        {"job_id": job_id, "sequence": sequence, "type": type_, "data": data, "now": now, "owner_of": job_id},
    )


def event_insert_many(conn: Connection | sqlite3.Connection, rows: list[tuple[str, int, str, str, int]]) -> None:
    """:func:`event_insert` for several events in one statement.

    *rows*: ``(job_id, sequence, type, data, created_at)``."""
    if rows and not isinstance(conn, sqlite3.Connection):
        params: dict[str, Any] = {}
        values = []
        for n, (job_id, sequence, type_, data, created_at) in enumerate(rows):
            params.update({f"j{n}": job_id, f"s{n}": sequence, f"t{n}": type_, f"d{n}": data, f"c{n}": created_at})
            params[f"o{n}"] = job_id  # bound again under its own name, as in event_insert
            values.append(f"(:j{n}, :s{n}, :t{n}, :d{n}, :c{n}, {_EVENT_OWNER.format(job=f':o{n}')})")
        insert = "INSERT INTO job_events (job_id, sequence, type, data, created_at, owner_id) VALUES "
        conn.execute(_q(insert + ",".join(values)), params)
    elif rows:
        owner = _EVENT_OWNER.format(job="?")
        conn.execute(
            "INSERT INTO job_events (job_id, sequence, type, data, created_at, owner_id) VALUES "
            + ",".join(f"(?,?,?,?,?,{owner})" for _ in rows),
            tuple(value for row in rows for value in (*row, row[0])),
        )


def event_list_after(conn: Connection, job_id: str, after: int, limit: int) -> list[EventRow]:
    rows = conn.execute(
        _q(
            "SELECT job_id, sequence, type, data, created_at FROM job_events WHERE job_id = :id AND sequence > :after "
            "ORDER BY sequence LIMIT :limit"
        ),
        {"id": job_id, "after": after, "limit": limit},
    ).fetchall()
    return [EventRow(*r) for r in rows]


def event_list_of_type(conn: Connection, job_id: str, type_: str, limit: int) -> list[EventRow]:
    """The job's first *limit* events of one type, in order (its status events: its attempts)."""
    rows = conn.execute(
        _q(
            "SELECT job_id, sequence, type, data, created_at FROM job_events WHERE job_id = :id AND type = :type "
            "ORDER BY sequence LIMIT :limit"
        ),
        {"id": job_id, "type": type_, "limit": limit},
    ).fetchall()
    return [EventRow(*r) for r in rows]


# -- idempotency -------------------------------------------------------------------------------------
def idempotency_get(conn: Connection, owner_id: str, kind: str, key: str) -> tuple[str, str] | None:
    """``(request_digest, job_id)`` recorded for this owner's key, if any."""
    row = conn.execute(
        _q("SELECT request_digest, job_id FROM idempotency WHERE owner_id = :owner AND kind = :kind AND key = :key"),
        {"owner": owner_id, "kind": kind, "key": key},
    ).fetchone()
    return None if row is None else (row[0], row[1])


def idempotency_insert(
    conn: Connection, owner_id: str, kind: str, key: str, digest: str, job_id: str, now: int
) -> bool:
    """Record the key; False when a concurrent transaction recorded it first."""
    cur = conn.execute(
        _q(
            "INSERT INTO idempotency (owner_id, kind, key, request_digest, job_id, created_at) "
            "VALUES (:owner, :kind, :key, :digest, :job_id, :now) ON CONFLICT DO NOTHING"
        ),
        {"owner": owner_id, "kind": kind, "key": key, "digest": digest, "job_id": job_id, "now": now},
    )
    return cur.rowcount == 1


# -- outbox ------------------------------------------------------------------------------------------
#: Rows per multi-row ``INSERT`` (PostgreSQL binds at most 65,535 parameters in one statement).
INSERT_CHUNK = 1000


def outbox_insert_many(conn: Connection | sqlite3.Connection, entries: Sequence[OutboxEntry], *, now: int) -> None:
    """Write the messages of *entries* to the outbox in order (the relay publishes by id), one statement per
    :data:`INSERT_CHUNK` of them."""
    for start in range(0, len(entries), INSERT_CHUNK):
        _outbox_insert_chunk(conn, entries[start : start + INSERT_CHUNK], now)


def _outbox_insert_chunk(conn: Connection | sqlite3.Connection, entries: Sequence[OutboxEntry], now: int) -> None:
    params: dict[str, Any] = {"now": now}
    values = []
    for n, entry in enumerate(entries):
        params.update(
            {
                f"m{n}": entry.message_id,
                f"j{n}": entry.job_id,
                f"q{n}": entry.queue_name,
                f"a{n}": entry.actor_name,
                f"b{n}": entry.body,
                f"e{n}": entry.eta,
            }
        )
        values.append(f"(:m{n}, :j{n}, :q{n}, :a{n}, :b{n}, :e{n}, :now, 0)")
    _exec(
        conn,
        "INSERT INTO outbox (message_id, job_id, queue_name, actor_name, body, eta, created_at, attempts) VALUES "
        + ", ".join(values),
        params,
    )


def outbox_pending(conn: Connection, limit: int) -> list[OutboxRow]:
    """Unpublished rows, oldest first (locked, skipping rows another relay holds, on PostgreSQL)."""
    sql = (
        "SELECT id, message_id, queue_name, actor_name, body, eta FROM outbox WHERE published_at IS NULL "
        "ORDER BY id LIMIT :limit"
    ) + _for_update(conn, skip_locked=True)
    return [OutboxRow(r[0], r[1], r[2], r[3], bytes(r[4]), r[5]) for r in conn.execute(_q(sql), {"limit": limit})]


def outbox_mark_published(conn: Connection, outbox_ids: list[int], now: int) -> None:
    """Mark the rows published (one statement for a relay's batch)."""
    if not outbox_ids:
        return
    stmt = _SQL.get("outbox_mark_published")
    if stmt is None:
        stmt = _SQL["outbox_mark_published"] = text(
            "UPDATE outbox SET published_at = :now, attempts = attempts + 1 WHERE id IN :ids"
        ).bindparams(bindparam("ids", expanding=True))
    conn.execute(stmt, {"ids": outbox_ids, "now": now})


#: The channel a new outbox row is announced on (PostgreSQL; revision 0019's trigger): relays LISTEN to it.
OUTBOX_CHANNEL = "tenure_outbox"


def outbox_mark_failed(conn: Connection, outbox_id: int, error: str) -> None:
    conn.execute(
        _q("UPDATE outbox SET attempts = attempts + 1, last_error = :error WHERE id = :id"),
        {"id": outbox_id, "error": error},
    )


def outbox_prune(conn: Connection, published_before: int) -> int:
    return conn.execute(
        _q("DELETE FROM outbox WHERE published_at IS NOT NULL AND published_at < :before"), {"before": published_before}
    ).rowcount


def outbox_pending_count(conn: Connection) -> int:
    return int(conn.execute(_q("SELECT count(*) FROM outbox WHERE published_at IS NULL")).scalar_one())


# -- workflows (a parent job and its steps, a DAG in job_dependencies) ---------------------------------
#: ``worker_id`` of a running workflow parent: the steps' completions drive it, no worker leases it.
WORKFLOW_WORKER = "workflow"
#: ``lease_expires_at`` of a running workflow parent: never expires, so recovery never touches it.
WORKFLOW_LEASE = 2**62


def job_workflow_start(conn: Connection, parent_id: str, now: int) -> int | None:
    """A new workflow parent: queued → running (coordinated by its steps, not leased)."""
    return _move(
        conn,
        "status = 'running', attempt = 1, worker_id = :worker, lease_expires_at = :lease, started_at = :now",
        "id = :id AND status = 'queued'",
        {"id": parent_id, "worker": WORKFLOW_WORKER, "lease": WORKFLOW_LEASE, "now": now},
    )


def job_workflow_finish(
    conn: Connection, parent_id: str, status: str, result: str | None, error: str | None, now: int
) -> int | None:
    """A running workflow parent → succeeded / failed / cancelled."""
    return _move(
        conn,
        _FINISH + ", result = :result, error = :error, progress = coalesce(:progress, progress)",
        "id = :id AND status = 'running' AND worker_id = :worker",
        {
            "id": parent_id,
            "status": status,
            "result": result,
            "error": error,
            "now": now,
            "worker": WORKFLOW_WORKER,
            "progress": 1.0 if status == "succeeded" else None,
        },
    )


def job_workflow_progress(conn: Connection | sqlite3.Connection, parent_id: str, fraction: float, now: int) -> None:
    _exec(
        conn,
        "UPDATE jobs SET progress = :fraction, updated_at = :now "
        "WHERE id = :id AND status = 'running' AND worker_id = :worker",
        {"id": parent_id, "fraction": fraction, "now": now, "worker": WORKFLOW_WORKER},
    )


def job_workflow_config_for_update(conn: Connection | sqlite3.Connection, parent_id: str) -> str | None:
    """The config of *parent_id* if it is a running workflow parent, row-locked on PostgreSQL (else None)."""
    row = _exec(
        conn,
        "SELECT config FROM jobs WHERE id = :id AND status = 'running' AND worker_id = :worker" + _for_update(conn),
        {"id": parent_id, "worker": WORKFLOW_WORKER},
    ).fetchone()
    return None if row is None else str(row[0])


class StepProgress(NamedTuple):
    """A workflow step's status and progress (what its parent's progress is the mean of)."""

    status: str
    progress: float | None


def job_children_progress(conn: Connection | sqlite3.Connection, parent_id: str) -> list[StepProgress]:
    rows = _exec(conn, "SELECT status, progress FROM jobs WHERE parent_job_id = :p", {"p": parent_id}).fetchall()
    return [StepProgress(str(r[0]), None if r[1] is None else float(r[1])) for r in rows]


def job_workflow_parent_id(conn: Connection, job_id: str) -> str | None:
    """The id of the running workflow parent of *job_id*, if it is a step of one.

    Children of other parents (a supervisor job that submits its own children) are not steps.
    """
    row = conn.execute(
        _q(
            "SELECT p.id FROM jobs c JOIN jobs p ON p.id = c.parent_job_id "
            "WHERE c.id = :id AND p.status = 'running' AND p.worker_id = :worker"
        ),
        {"id": job_id, "worker": WORKFLOW_WORKER},
    ).fetchone()
    return None if row is None else row[0]


def job_children(conn: Connection, parent_id: str) -> list[JobRow]:
    rows = conn.execute(
        _q(f"SELECT {JOB_COLUMNS} FROM jobs WHERE parent_job_id = :p ORDER BY created_at, id"), {"p": parent_id}
    ).fetchall()
    return [r for r in map(_job, rows) if r is not None]


def dependency_insert(conn: Connection, job_id: str, depends_on_job_id: str) -> None:
    conn.execute(
        _q("INSERT INTO job_dependencies (job_id, depends_on_job_id) VALUES (:j, :d)"),
        {"j": job_id, "d": depends_on_job_id},
    )


def dependency_list(conn: Connection, parent_id: str) -> list[tuple[str, str]]:
    """``(job_id, depends_on_job_id)`` edges of a workflow's steps."""
    return [
        (r[0], r[1])
        for r in conn.execute(
            _q(
                "SELECT d.job_id, d.depends_on_job_id FROM job_dependencies d JOIN jobs j ON j.id = d.job_id "
                "WHERE j.parent_job_id = :p"
            ),
            {"p": parent_id},
        )
    ]


def dependency_ready_dependents(conn: Connection, job_id: str) -> list[JobRow]:
    """Queued steps depending on *job_id* whose dependencies have all succeeded."""
    rows = conn.execute(
        _q(
            f"SELECT {', '.join('j.' + c.strip() for c in JOB_COLUMNS.split(','))} FROM job_dependencies d "
            "JOIN jobs j ON j.id = d.job_id WHERE d.depends_on_job_id = :id AND j.status = 'queued' "
            "AND NOT EXISTS (SELECT 1 FROM job_dependencies d2 JOIN jobs j2 ON j2.id = d2.depends_on_job_id "
            "WHERE d2.job_id = d.job_id AND j2.status <> 'succeeded')"
        ),
        {"id": job_id},
    ).fetchall()
    return [r for r in map(_job, rows) if r is not None]


def dependency_unmet_count(conn: Connection, job_id: str) -> int:
    return int(
        conn.execute(
            _q(
                "SELECT count(*) FROM job_dependencies d JOIN jobs j ON j.id = d.depends_on_job_id "
                "WHERE d.job_id = :id AND j.status <> 'succeeded'"
            ),
            {"id": job_id},
        ).scalar_one()
    )


def job_workflow_extend(conn: Connection, parent_id: str, payload: str, now: int) -> int | None:
    """A running workflow parent gets its extended step description; reserves the event sequence
    of its ``workflow_extended`` event."""
    row = conn.execute(
        _q(
            "UPDATE jobs SET payload = :payload, updated_at = :now, event_seq = event_seq + 1 "
            "WHERE id = :id AND status = 'running' AND worker_id = :worker RETURNING event_seq"
        ),
        {"id": parent_id, "payload": payload, "now": now, "worker": WORKFLOW_WORKER},
    ).fetchone()
    return None if row is None else int(row[0])


def dependency_list_of_jobs(conn: Connection, job_ids: list[str]) -> list[tuple[str, str]]:
    """``(job_id, depends_on_job_id)`` edges of the given jobs (a retry's reused steps)."""
    if not job_ids:
        return []
    stmt = text("SELECT job_id, depends_on_job_id FROM job_dependencies WHERE job_id IN :ids").bindparams(
        bindparam("ids", expanding=True)
    )
    return [(r[0], r[1]) for r in conn.execute(stmt, {"ids": job_ids})]


# -- run now (clear a retry's backoff) -------------------------------------------------------------------
@dataclass(frozen=True)
class ExpeditedJob:
    id: str
    owner_id: str
    kind: str
    actor_name: str
    queue_name: str
    priority: int
    sequence: int
    created_at: int
    concurrency_key: str | None
    rate_key: str | None
    trace_context: str | None
    #: It waits for admission (no message to expedite): its turn comes as any due job's.
    held: str | None


def job_run_now(conn: Connection, job_id: str, now: int) -> ExpeditedJob | None:
    """A queued job waiting out a retry backoff (``run_after`` in the future) may run now.

    Reserves the sequence of its ``run_now`` event. None when the job is not queued with a pending
    backoff (running, finished, already due, or a workflow step waiting for its dependencies).
    """
    row = conn.execute(
        _q(
            "UPDATE jobs SET run_after = :now, updated_at = :now, event_seq = event_seq + 1 "
            "WHERE id = :id AND status = 'queued' AND run_after > :now AND actor_name <> '' "
            "RETURNING id, owner_id, kind, actor_name, queue_name, priority, event_seq, created_at, concurrency_key, "
            "rate_key, trace_context, held"
        ),
        {"id": job_id, "now": now},
    ).fetchone()
    return None if row is None else ExpeditedJob(*row)
