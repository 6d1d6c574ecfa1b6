"""Live-feed connection slots shared by every web process on every host (``live_slots``, in the job database).

An identity may hold at most *limit* live connections at once, wherever they are served: taking a slot
(:func:`acquire`) counts the identity's rows in one serialised write transaction (SQLite's write lock;
a per-identity advisory lock on PostgreSQL) and inserts one when there is room. The connection's
streaming loop :func:`renew`\\s its row well within ``ttl_ms`` and :func:`release`\\s it when it ends. A
process killed with its connections open stops renewing: its rows expire after ``ttl_ms`` and stop
counting, so slots never leak for good. No Redis: the job database is shared by every web process
already. SQL in :mod:`accounts.slot_store`.
"""

from __future__ import annotations

import secrets
import time

from sqlalchemy import Engine

from . import _read, slot_store

#: How long a slot outlives its last renewal (a dead process's connections stop counting after this).
DEFAULT_TTL_MS = 30_000


def _now_ms() -> int:
    return int(time.time() * 1000)


def acquire(engine: Engine, identity: str, limit: int, *, holder: str, ttl_ms: int = DEFAULT_TTL_MS) -> str | None:
    """A new slot's id for *identity*, or ``None`` when it already holds *limit* live ones."""
    slot_id = secrets.token_hex(16)
    now = _now_ms()
    with engine.begin() as conn:
        taken = slot_store.slot_take(conn, slot_id, identity, holder, limit, now, now + ttl_ms)
    return slot_id if taken else None


def renew(engine: Engine, slot_id: str, *, ttl_ms: int = DEFAULT_TTL_MS) -> bool:
    """Keep the slot for another *ttl_ms*; False when it was no longer held (it expired meanwhile)."""
    now = _now_ms()
    with engine.begin() as conn:
        return slot_store.slot_renew(conn, slot_id, now, now + ttl_ms)


def release(engine: Engine, slot_id: str) -> None:
    with engine.begin() as conn:
        slot_store.slot_delete(conn, slot_id)


def held(engine: Engine, identity: str) -> int:
    """How many live slots *identity* holds now (every process)."""
    with _read(engine) as conn:
        return slot_store.slot_count(conn, identity, _now_ms())
