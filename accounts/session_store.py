"""All SQL for login sessions: the ``login_sessions`` table (revision 0018; :data:`login_sessions` mirrors it).

One row per UI login. ``id`` is the SHA-256 of the session secret that the signed session cookie
carries (the secret itself is never stored); ``password_digest`` is the SHA-256 of the user's password
hash at login, so a password change leaves every older session's digest stale. A logout deletes the
row. Rows belong to an existing user (FK, ON DELETE CASCADE).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import BigInteger, Column, Connection, ForeignKey, Index, Integer, String, Table, delete, insert, select

from .store import metadata

login_sessions = Table(
    "login_sessions",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("user_id", Integer, ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    Column("password_digest", String(64), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Index("ix_login_sessions_user_id_created_at", "user_id", "created_at"),
)


@dataclass(frozen=True)
class SessionRow:
    user_id: int
    password_digest: str
    created_at: int


def session_insert(conn: Connection, session_id: str, user_id: int, password_digest: str, now_ms: int) -> None:
    conn.execute(
        insert(login_sessions).values(
            id=session_id, user_id=user_id, password_digest=password_digest, created_at=now_ms
        )
    )


def session_get(conn: Connection, session_id: str) -> SessionRow | None:
    query = select(login_sessions.c.user_id, login_sessions.c.password_digest, login_sessions.c.created_at).where(
        login_sessions.c.id == session_id
    )
    row = conn.execute(query).first()
    return SessionRow(int(row.user_id), str(row.password_digest), int(row.created_at)) if row else None


def session_delete(conn: Connection, session_id: str) -> bool:
    return conn.execute(delete(login_sessions).where(login_sessions.c.id == session_id)).rowcount == 1


def session_prune(conn: Connection, user_id: int, *, created_before_ms: int, keep: int) -> int:
    """Delete *user_id*'s sessions created before *created_before_ms*, and all but its *keep* newest."""
    newest = (
        select(login_sessions.c.id)
        .where(login_sessions.c.user_id == user_id)
        .order_by(login_sessions.c.created_at.desc(), login_sessions.c.id)
        .limit(keep)
    )
    old = conn.execute(
        delete(login_sessions).where(
            login_sessions.c.user_id == user_id,
            (login_sessions.c.created_at < created_before_ms) | login_sessions.c.id.not_in(newest.scalar_subquery()),
        )
    )
    return int(old.rowcount or 0)
