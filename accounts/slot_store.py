"""All SQL for live-feed connection slots: the ``live_slots`` table (revision 0018; :data:`live_slots` mirrors it).

One row per open live-feed connection of any web process on any host: the identity holding it, the
process (``holder``: ``host:pid``) and ``expires_at``, which the connection's streaming loop renews. A
row whose ``expires_at`` has passed belongs to a process that died (or a loop that stalled): it no
longer counts and the next :func:`slot_take` deletes it.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import BigInteger, Column, Connection, Index, String, Table, delete, func, insert, select, text, update

from .store import metadata

live_slots = Table(
    "live_slots",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("identity", String(200), nullable=False),
    Column("holder", String(300), nullable=False),
    Column("acquired_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False),
    Index("ix_live_slots_identity_expires_at", "identity", "expires_at"),
)


def _lock_identity(conn: Connection, identity: str) -> None:
    """Serialise slot decisions for *identity* until the transaction ends. SQLite's write transaction
    (``BEGIN IMMEDIATE``) already does; on PostgreSQL (READ COMMITTED) two transactions could otherwise both
    count three rows and both insert a fourth."""
    if conn.dialect.name == "postgresql":
        key = int.from_bytes(hashlib.sha256(f"tenure.live_slots:{identity}".encode()).digest()[:8], "big", signed=True)
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def slot_take(
    conn: Connection, slot_id: str, identity: str, holder: str, limit: int, now_ms: int, expires_at: int
) -> bool:
    """Insert a slot for *identity* unless it already holds *limit* unexpired ones (expired rows are
    deleted first). Call in a write transaction."""
    _lock_identity(conn, identity)
    conn.execute(delete(live_slots).where(live_slots.c.expires_at < now_ms))
    held = conn.execute(
        select(func.count()).select_from(live_slots).where(live_slots.c.identity == identity)
    ).scalar_one()
    if int(held) >= limit:
        return False
    conn.execute(
        insert(live_slots).values(
            id=slot_id, identity=identity, holder=holder, acquired_at=now_ms, expires_at=expires_at
        )
    )
    return True


def slot_renew(conn: Connection, slot_id: str, now_ms: int, expires_at: int) -> bool:
    """Push an unexpired slot's expiry out; False when the slot is gone or had expired (no longer held)."""
    result = conn.execute(
        update(live_slots)
        .where(live_slots.c.id == slot_id, live_slots.c.expires_at >= now_ms)
        .values(expires_at=expires_at)
    )
    return result.rowcount == 1


def slot_delete(conn: Connection, slot_id: str) -> None:
    conn.execute(delete(live_slots).where(live_slots.c.id == slot_id))


def slot_count(conn: Connection, identity: str, now_ms: int) -> int:
    """*identity*'s unexpired slots."""
    query = (
        select(func.count())
        .select_from(live_slots)
        .where(live_slots.c.identity == identity, live_slots.c.expires_at >= now_ms)
    )
    return int(conn.execute(query).scalar_one())
