"""Login sessions, and the credentials a long-lived request checks again while it runs.

A UI login starts a session (:func:`start_session`): a random secret for the signed session cookie,
stored only as its SHA-256 (``login_sessions``, :mod:`accounts.session_store`) beside a digest of the
user's password hash. :func:`session_user` is the session's user while the row exists, the user is
active, the password is the one it logged in with and the session is younger than
:data:`SESSION_LIFETIME_MS`; :func:`end_session` (logout) deletes the row. So a logout or a password
change ends a session on the server, not just in one browser.

A live-feed stream outlives its handshake: it keeps a :class:`Credential` (digests only, never a
secret) and asks :func:`credential_user` again every second whether that credential still stands
for an active user — a logout, a password change, a revoked token or a disabled user says no.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import Engine

from . import User, UserNotFound, _public, _read, session_store, store

#: A session ends this long after its login even without a logout (Flask's PERMANENT_SESSION_LIFETIME).
SESSION_LIFETIME_MS = 31 * 86_400_000
#: Sessions kept per user; a login beyond this ends the user's oldest.
MAX_SESSIONS_PER_USER = 100
#: Longest session secret accepted (a cookie carrying more was not made here).
_MAX_SECRET = 200


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _now_ms() -> int:
    return int(time.time() * 1000)


def start_session(engine: Engine, user_id: int) -> str:
    """Start a login session for *user_id*; returns its secret (for the signed session cookie only).

    Raises: :class:`accounts.UserNotFound`.
    """
    secret = secrets.token_urlsafe(32)
    now = _now_ms()
    with engine.begin() as conn:
        row = store.user_get(conn, user_id)
        if row is None:
            raise UserNotFound()
        session_store.session_insert(conn, _digest(secret), user_id, _digest(row.password_hash), now)
        session_store.session_prune(
            conn, user_id, created_before_ms=now - SESSION_LIFETIME_MS, keep=MAX_SESSIONS_PER_USER
        )
    return secret


def end_session(engine: Engine, secret: str | None) -> None:
    """End the session *secret* belongs to (logout); nothing happens for an unknown or ended one."""
    if not isinstance(secret, str) or not secret or len(secret) > _MAX_SECRET:
        return
    with engine.begin() as conn:
        session_store.session_delete(conn, _digest(secret))


def session_user(engine: Engine, secret: str | None) -> User | None:
    """The active user whose live session *secret* belongs to, or ``None``."""
    if not isinstance(secret, str) or not secret or len(secret) > _MAX_SECRET:
        return None
    found = credential_user(engine, Credential("session", 0, _digest(secret)))
    return None if found is None else found[0]


@dataclass(frozen=True)
class Credential:
    """What a request authenticated with, kept to check it again later: ``kind`` (``session`` |
    ``token`` | ``basic``), the user it stood for, and a digest — of the session secret, of the token
    secret, or of the password hash it was verified against."""

    kind: str
    user_id: int
    digest: str


def session_credential(user_id: int, secret: str) -> Credential:
    return Credential("session", user_id, _digest(secret))


def token_credential(user_id: int, secret: str) -> Credential:
    return Credential("token", user_id, _digest(secret))  # the token's stored hash (accounts.create_token)


def basic_credential(engine: Engine, user_id: int) -> Credential | None:
    """The credential of a request that just authenticated *user_id* with a password (``None``: no such user)."""
    with _read(engine) as conn:
        row = store.user_get(conn, user_id)
    return None if row is None else Credential("basic", user_id, _digest(row.password_hash))


def credential_user(engine: Engine, credential: Credential) -> tuple[User, frozenset[str]] | None:
    """The active user *credential* still stands for and what it may do now (its role's actions; a token's:
    those of them the token carries), or ``None`` (logged out, session too old, password changed, token
    revoked, user disabled or gone). One read; no password hashing."""
    token_actions: frozenset[str] | None = None
    with _read(engine) as conn:
        if credential.kind == "token":
            found = store.token_find_active_user(conn, credential.digest)
            row = found[1] if found else None
            token_actions = found[0].permissions if found else None
        elif credential.kind == "session":
            session = session_store.session_get(conn, credential.digest)
            if session is None or session.created_at < _now_ms() - SESSION_LIFETIME_MS:
                return None
            row = store.user_get(conn, session.user_id)
            if row is not None and _digest(row.password_hash) != session.password_digest:
                return None
        elif credential.kind == "basic":
            row = store.user_get(conn, credential.user_id)
            if row is not None and _digest(row.password_hash) != credential.digest:
                return None
        else:
            raise ValueError(f"unknown credential kind {credential.kind!r}")
        if row is None or row.disabled or (credential.user_id and row.id != credential.user_id):
            return None
        user = _public(row, store.role_actions(conn, row.role))
    actions = user.permissions if token_actions is None else token_actions & user.permissions
    return user, actions
