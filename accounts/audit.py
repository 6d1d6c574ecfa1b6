"""The audit log: who did what, from where, when, and how it ended.

Callers write an :class:`Entry` with :func:`record` on the connection of the transaction that does the
action, so the action and its record commit together or not at all (``webapp.audit_log`` opens that
transaction for the web app; :func:`recorded` does it for ``tenure users``, which changes accounts
from the command line). An action that was refused or failed leaves no effect; its row is then written alone.

What a row never holds: a password, a token's secret, a job's payload. Details are filters, counts
and names. SQL: :mod:`accounts.audit_store`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine

from . import audit_store as store
from .store import reading

#: Every action the log records, with what it means.
ACTIONS: dict[str, str] = {
    "login": "a UI login (refused: wrong name or password; the name tried is recorded, never the password)",
    "auth.failed": "an API request whose credentials do not authenticate (Basic: the name tried)",
    "access": "a request refused for lack of a permission (details: the permission)",
    "token.create": "an API token created (details: its name and actions)",
    "token.revoke": "an API token revoked",
    "user.create": "a user created",
    "user.password": "a user's password set",
    "user.role": "a user's role changed (details: from, to)",
    "user.disable": "a user disabled",
    "user.enable": "a user enabled again",
    "role.create": "a role defined",
    "role.update": "a role's actions or description changed",
    "role.delete": "a role deleted",
    "settings.save": "runtime settings saved (details: the revision and the keys changed)",
    "job.cancel": "a job cancelled",
    "job.retry": "a job retried (details: the new job)",
    "job.delete": "a finished job deleted (details: the jobs removed)",
    "job.run_now": "a waiting job started now",
    "jobs.bulk_cancel": "jobs cancelled in bulk (details: the filter or selection, counts)",
    "jobs.bulk_retry": "jobs retried in bulk (details: the filter or selection, counts)",
    "queue.pause": "a queue paused",
    "queue.resume": "a queue resumed",
    "dead_letters.replay": "dead letters replayed by queue or ids",
    "dead_letters.purge": "dead letters purged by queue or ids",
    "dead_letters.bulk_replay": "dead letters replayed by filter (details: the filter, counts)",
    "dead_letters.bulk_purge": "dead letters purged by filter (details: the filter, counts)",
    "schedule.run": "a schedule fired now",
    "schedule.pause": "a schedule paused",
    "schedule.resume": "a schedule resumed",
    "workers.acknowledge": "unclean worker exits acknowledged",
}
OUTCOMES = ("ok", "refused", "failed")
#: Longest ``details`` JSON kept; a larger object is replaced by a note saying so.
MAX_DETAILS_CHARS = 4000
MAX_LIMIT = 500


@dataclass
class Entry:
    """One row of the log, as its writer fills it in (``at`` is set when it is recorded)."""

    action: str
    outcome: str = "ok"
    actor_id: int | None = None
    actor_name: str | None = None
    via: str | None = None
    token_id: int | None = None
    ip: str | None = None
    user_agent: str | None = None
    target_type: str | None = None
    target: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None


@dataclass(frozen=True)
class Record:
    """A recorded row (what the API and the UI show)."""

    id: int
    at: datetime
    action: str
    outcome: str
    actor_id: int | None
    actor_name: str | None
    via: str | None
    token_id: int | None
    ip: str | None
    user_agent: str | None
    target_type: str | None
    target: str | None
    details: dict[str, Any]
    reason: str | None


@dataclass(frozen=True)
class AuditFilter:
    """Which rows a page shows; None means any. ``since`` inclusive, ``until`` exclusive."""

    actor: str | None = None
    action: str | None = None
    outcome: str | None = None
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True)
class Page:
    items: list[Record]
    next_cursor: str | None


def _clip(value: str | None, chars: int) -> str | None:
    return None if value is None else value[:chars]


def _details_json(details: dict[str, Any]) -> str | None:
    if not details:
        return None
    text = json.dumps(details, default=str, ensure_ascii=False, sort_keys=True)
    if len(text) > MAX_DETAILS_CHARS:
        return json.dumps({"truncated": True, "keys": sorted(details)[:50]})
    return text


def record(conn: Connection, entry: Entry, *, now: datetime | None = None) -> int:
    """Write *entry* in *conn*'s open transaction (it commits or rolls back with it); its id.

    Raises:
      ValueError: An unknown action or outcome (a programming error, never a user's input).
    """
    if entry.action not in ACTIONS or entry.outcome not in OUTCOMES:
        raise ValueError(f"unknown audit action or outcome: {entry.action!r} {entry.outcome!r}")
    at = now or datetime.now(UTC)
    return store.entry_insert(
        conn,
        {
            "at": int(at.timestamp() * 1000),
            "action": entry.action,
            "outcome": entry.outcome,
            "actor_id": entry.actor_id,
            "actor_name": _clip(entry.actor_name, 64),
            "via": _clip(entry.via, 16),
            "token_id": entry.token_id,
            "ip": _clip(entry.ip, 64),
            "user_agent": _clip(entry.user_agent, 300),
            "target_type": _clip(entry.target_type, 32),
            "target": _clip(entry.target, 300),
            "details": _details_json(entry.details),
            "reason": _clip(entry.reason, 500),
        },
    )


@contextmanager
def recorded(engine: Engine, entry: Entry) -> Iterator[Connection]:
    """A transaction for an action and its record: the block does the action on the connection, *entry*
    is written just before the commit. When the block raises, nothing commits and *entry* is written
    alone as ``failed`` with the error's message (the caller's errors say nothing secret)."""
    try:
        with engine.begin() as conn:
            yield conn
            record(conn, entry)
    except Exception as exc:
        entry.outcome, entry.reason = "failed", str(exc) or type(exc).__name__
        record_alone(engine, entry)
        raise


def record_alone(engine: Engine, entry: Entry) -> int:
    """Write *entry* in a transaction of its own (an event with no other write: a refusal, a login)."""
    with engine.begin() as conn:
        return record(conn, entry)


def _public(row: Any) -> Record:
    try:
        details = json.loads(row.details) if row.details else {}
    except ValueError:
        details = {}
    return Record(
        id=int(row.id),
        at=datetime.fromtimestamp(row.at / 1000, UTC),
        action=row.action,
        outcome=row.outcome,
        actor_id=row.actor_id,
        actor_name=row.actor_name,
        via=row.via,
        token_id=row.token_id,
        ip=row.ip,
        user_agent=row.user_agent,
        target_type=row.target_type,
        target=row.target,
        details=details if isinstance(details, dict) else {},
        reason=row.reason,
    )


def _where(where: AuditFilter) -> store.AuditFilterSQL:
    def ms(value: datetime | None) -> int | None:
        return None if value is None else int(value.timestamp() * 1000)

    return store.AuditFilterSQL(where.actor, where.action, where.outcome, ms(where.since), ms(where.until))


MAX_ROW_ID = 2**63 - 1


def decode_cursor(cursor: str | None) -> int | None:
    """A page cursor (the last row's id) as a number; raises ValueError for anything else."""
    if cursor is None or cursor == "":
        return None
    # Row ids are 64-bit: a 19-digit number past 2**63 - 1 is no id, and SQLite cannot bind it.
    if not cursor.isascii() or not cursor.isdigit() or len(cursor) > 19 or int(cursor) > MAX_ROW_ID:
        raise ValueError("cursor is not one this log handed out")
    return int(cursor)


def page(engine: Engine, where: AuditFilter, *, cursor: str | None = None, limit: int = 50) -> Page:
    """One page of the log, newest first, and the cursor of the next (older) page.

    Raises:
      ValueError: *cursor* is malformed.
    """
    before = decode_cursor(cursor)
    limit = max(1, min(limit, MAX_LIMIT))
    with reading(engine) as conn:
        rows = store.entries_before(conn, _where(where), before, limit + 1)
    items = [_public(r) for r in rows[:limit]]
    return Page(items, str(items[-1].id) if len(rows) > limit else None)


def export(engine: Engine, where: AuditFilter, *, batch: int = MAX_LIMIT) -> Iterator[Record]:
    """Every row matching *where*, newest first, read a page at a time."""
    before: int | None = None
    while True:
        with reading(engine) as conn:
            rows = store.entries_before(conn, _where(where), before, batch)
        for row in rows:
            yield _public(row)
        if len(rows) < batch:
            return
        before = int(rows[-1].id)


def prune(engine: Engine, older_than: datetime, *, batch: int = 1000, max_batches: int = 100) -> int:
    """Delete rows recorded before *older_than*, a batch per transaction; how many were deleted."""
    cutoff = int(older_than.timestamp() * 1000)
    deleted = 0
    for _ in range(max_batches):
        with engine.begin() as conn:
            n = store.entries_delete_older(conn, cutoff, batch)
        deleted += n
        if n < batch:
            break
    return deleted
