"""All SQL of runtime settings: the ``runtime_settings`` history.

See :mod:`settings.runtime_models` for the table. Callers pass the connection (one transaction
per save: read the latest revision, then insert the next one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, insert, select, text

from .runtime_models import runtime_settings


@dataclass(frozen=True)
class RevisionRow:
    """One saved batch."""

    revision: int
    saved_at: int
    saved_by: str
    document: str


def latest(conn: Connection) -> RevisionRow | None:
    """The newest saved batch, or None before the first save."""
    row = conn.execute(
        select(
            runtime_settings.c.revision,
            runtime_settings.c.saved_at,
            runtime_settings.c.saved_by,
            runtime_settings.c.document,
        )
        .order_by(runtime_settings.c.revision.desc())
        .limit(1)
    ).first()
    return None if row is None else RevisionRow(int(row[0]), int(row[1]), str(row[2]), str(row[3]))


def latest_document(conn: Any) -> str | None:
    """The newest saved batch's document, on a SQLAlchemy connection or a DB-API one (the job layer's claim
    path reads it inside its own transaction on its raw sqlite3 connection)."""
    sql = "SELECT document FROM runtime_settings ORDER BY revision DESC LIMIT 1"
    row = (conn.execute(text(sql)) if isinstance(conn, Connection) else conn.execute(sql)).fetchone()
    return None if row is None else str(row[0])


def latest_revision(conn: Connection) -> int:
    """The newest revision number (0 before the first save)."""
    return int(conn.execute(select(func.coalesce(func.max(runtime_settings.c.revision), 0))).scalar_one())


def insert_revision(conn: Connection, revision: int, saved_at: int, saved_by: str, document: str) -> None:
    """Append a batch (the primary key refuses a second row with the same revision)."""
    conn.execute(
        insert(runtime_settings).values(revision=revision, saved_at=saved_at, saved_by=saved_by, document=document)
    )


def history(conn: Connection, limit: int) -> list[RevisionRow]:
    """The newest *limit* batches, newest first."""
    rows = conn.execute(
        select(
            runtime_settings.c.revision,
            runtime_settings.c.saved_at,
            runtime_settings.c.saved_by,
            runtime_settings.c.document,
        )
        .order_by(runtime_settings.c.revision.desc())
        .limit(limit)
    ).all()
    return [RevisionRow(int(r[0]), int(r[1]), str(r[2]), str(r[3])) for r in rows]
