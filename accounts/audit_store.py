"""All SQL of the audit log: the ``audit_log`` table (revision ``0017_permissions_audit``).

One row per recorded action or security event: when (``at``, epoch ms), what (``action``, a name of
:data:`accounts.audit.ACTIONS`), who (``actor_id`` and ``actor_name`` as they were then — no foreign
key: the record outlives the user; ``via`` how they proved it; ``token_id`` when a token, never its
secret), from where (``ip``, ``user_agent``), on what (``target_type``, ``target``), ``details`` (a
JSON object: filters and counts, never a secret or a job payload) and the ``outcome`` (CHECK: ``ok``,
``refused`` or ``failed``) with its ``reason``. Rows are written in the transaction of the action they
record; ``id`` orders them for paging (newest first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Connection,
    Index,
    Integer,
    String,
    Table,
    Text,
    delete,
    insert,
    select,
)

from .store import metadata

audit_log = Table(
    "audit_log",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("at", BigInteger, nullable=False),
    Column("action", String(64), nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("actor_id", Integer, nullable=True),
    Column("actor_name", String(64), nullable=True),
    Column("via", String(16), nullable=True),
    Column("token_id", Integer, nullable=True),
    Column("ip", String(64), nullable=True),
    Column("user_agent", String(300), nullable=True),
    Column("target_type", String(32), nullable=True),
    Column("target", String(300), nullable=True),
    Column("details", Text, nullable=True),
    Column("reason", String(500), nullable=True),
    CheckConstraint("outcome IN ('ok', 'refused', 'failed')", name="outcome_known"),
    Index("ix_audit_log_at", "at"),
    Index("ix_audit_log_actor_name_id", "actor_name", "id"),
)

_COLS = tuple(audit_log.c)


@dataclass(frozen=True)
class AuditFilterSQL:
    """What a page of the log selects: each field None for "any"."""

    actor: str | None = None
    action: str | None = None
    outcome: str | None = None
    at_from: int | None = None
    at_before: int | None = None


def entry_insert(conn: Connection, values: dict[str, Any]) -> int:
    result = conn.execute(insert(audit_log).values(**values))
    return int(result.inserted_primary_key[0])


def entries_before(conn: Connection, where: AuditFilterSQL, before_id: int | None, limit: int) -> list[Any]:
    """Up to *limit* rows matching *where* with ids below *before_id* (all when None), newest first."""
    query = select(*_COLS).order_by(audit_log.c.id.desc()).limit(limit)
    if before_id is not None:
        query = query.where(audit_log.c.id < before_id)
    if where.actor is not None:
        query = query.where(audit_log.c.actor_name == where.actor)
    if where.action is not None:
        query = query.where(audit_log.c.action == where.action)
    if where.outcome is not None:
        query = query.where(audit_log.c.outcome == where.outcome)
    if where.at_from is not None:
        query = query.where(audit_log.c.at >= where.at_from)
    if where.at_before is not None:
        query = query.where(audit_log.c.at < where.at_before)
    return list(conn.execute(query))


def entries_delete_older(conn: Connection, cutoff_ms: int, limit: int) -> int:
    """Delete up to *limit* of the oldest rows recorded before *cutoff_ms*; how many were deleted."""
    oldest = select(audit_log.c.id).where(audit_log.c.at < cutoff_ms).order_by(audit_log.c.id).limit(limit)
    ids = [int(i) for i in conn.execute(oldest).scalars()]
    if not ids:
        return 0
    return int(conn.execute(delete(audit_log).where(audit_log.c.id.in_(ids))).rowcount or 0)
