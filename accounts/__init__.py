"""Accounts: users (roles ``admin`` / ``user``), passwords and API tokens.

The web app authenticates people with these functions and the CLI creates them
(``tenure users create NAME --admin``, ``tenure users ensure-admin``). No Flask here: the CLI
and workers may import this module. All SQL lives in :mod:`accounts.store`.

Passwords are hashed with scrypt (``hashlib.scrypt``; n=2**15, r=8, p=1, 16-byte salt), stored as
``scrypt$n$r$p$salt_hex$hash_hex`` so the cost can be raised later without breaking old hashes.
API tokens are ``tnr_`` + 43 url-safe characters (256 bits); only their SHA-256 is stored, and the
secret is returned exactly once, by :func:`create_token`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError

from . import store

ROLES = ("admin", "user")
#: scrypt cost parameters for new hashes (≈ 50 ms on a laptop core; 32 MiB of memory).
SCRYPT_N = 2**15
SCRYPT_R = 8
SCRYPT_P = 1
#: Passwords shorter than this are refused.
MIN_PASSWORD_LENGTH = 10
TOKEN_PREFIX = "tnr_"
_USERNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class AccountError(Exception):
    """The account operation was refused."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class UserExists(AccountError):
    """A user with this name already exists."""


class InvalidUsername(AccountError):
    """A user name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit."""


class WeakPassword(AccountError):
    """The password is too short."""


class UserNotFound(AccountError):
    """No such user."""


class TokenNotFound(AccountError):
    """No such active token."""


@dataclass(frozen=True)
class User:
    """A user as the rest of Tenure sees it (no password hash)."""

    id: int
    username: str
    role: str
    disabled: bool
    created_at: datetime

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def owner_id(self) -> str:
        """The owner id this user's jobs carry (``jobs.submit(owner_id=…)``)."""
        return str(self.id)


@dataclass(frozen=True)
class ApiToken:
    """A token's public metadata; the secret is never part of it."""

    id: int
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def _read(engine: Engine) -> Connection:
    """A read-only connection: with the job layer's engines (jobs.db.make_engine) it opens a deferred
    ``BEGIN`` instead of ``BEGIN IMMEDIATE``, so logins and token checks never wait for the writer."""
    return engine.connect().execution_options(tenure_readonly=True)  # == jobs.db.READONLY


def _now() -> datetime:
    return datetime.now(UTC)


def _public(row: store.UserRow) -> User:
    return User(row.id, row.username, row.role, row.disabled, row.created_at)


def hash_password(password: str) -> str:
    """A new scrypt hash string for *password*."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, maxmem=128 * SCRYPT_R * SCRYPT_N * 2
    )
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${salt.hex()}${digest.hex()}"


def verify_password(password: str, stored: str) -> bool:
    """Whether *password* matches *stored* (constant-time compare; False on a malformed hash)."""
    try:
        scheme, n_s, r_s, p_s, salt_hex, digest_hex = stored.split("$")
        n, r, p = int(n_s), int(r_s), int(p_s)
        if scheme != "scrypt":
            return False
        digest = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt_hex), n=n, r=r, p=p, maxmem=128 * r * n * 2)
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(digest.hex(), digest_hex)


#: Verified against when the user does not exist, so a wrong name costs as much time as a wrong password.
_DUMMY_HASH = f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${'00' * 16}${'00' * 64}"


def generate_password() -> str:
    """A random password for generated accounts (20 url-safe characters, ~120 bits)."""
    return secrets.token_urlsafe(15)


def create_user(engine: Engine, username: str, password: str | None = None, *, role: str = "user") -> tuple[User, str]:
    """Create a user.

    Parameters: *password* ``None`` generates one. *role* is ``admin`` or ``user``.
    Raises: :class:`InvalidUsername`, :class:`WeakPassword`, :class:`UserExists`, ``ValueError`` for a bad role.
    Returns: the user and the password (the generated one, or the one given).
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}")
    if not _USERNAME_RE.match(username):
        raise InvalidUsername()
    password = generate_password() if password is None else password
    if len(password) < MIN_PASSWORD_LENGTH:
        raise WeakPassword(f"The password must have at least {MIN_PASSWORD_LENGTH} characters.")
    hashed = hash_password(password)
    try:
        with engine.begin() as conn:
            user_id = store.user_insert(conn, username, hashed, role, _now())
            row = store.user_get(conn, user_id)
    except IntegrityError as exc:
        raise UserExists(f"A user named {username!r} already exists.") from exc
    assert row is not None
    return _public(row), password


def ensure_admin(engine: Engine, username: str = "admin") -> tuple[User, str] | None:
    """Create *username* as an admin with a random password if there is no active admin yet.

    Returns: ``(user, password)`` when it created one (show the password once), else ``None``.
    """
    with _read(engine) as conn:
        if store.user_count_admins(conn):
            return None
        existing = store.user_get_by_name(conn, username)
    if existing is not None:
        # The name is taken by a non-admin: do not silently promote it; pick a free name instead.
        username = f"{username}-{secrets.token_hex(3)}"
    try:
        return create_user(engine, username, role="admin")
    except UserExists:
        return None  # another process created it at the same moment


def authenticate(engine: Engine, username: str, password: str) -> User | None:
    """The active user with this name and password, or ``None`` (same cost either way)."""
    with _read(engine) as conn:
        row = store.user_get_by_name(conn, username)
    if row is None:
        verify_password(password, _DUMMY_HASH)
        return None
    if not verify_password(password, row.password_hash) or row.disabled:
        return None
    return _public(row)


def get_user(engine: Engine, user_id: int) -> User | None:
    """The active user with this id, or ``None`` (disabled users count as missing)."""
    with _read(engine) as conn:
        row = store.user_get(conn, user_id)
    return _public(row) if row and not row.disabled else None


def get_user_by_name(engine: Engine, username: str) -> User | None:
    with _read(engine) as conn:
        row = store.user_get_by_name(conn, username)
    return _public(row) if row else None


def owner_id_of(engine: Engine, name: str) -> str | None:
    """The owner id the jobs of *name* carry: that user's; for a name no user has, the name itself when it
    can be an owner that is no user (a schedule's ``scheduler``); ``None`` for digits no user is named —
    owner ids of users are internal, so an id never stands for its user."""
    user = get_user_by_name(engine, name)
    if user is not None:
        return user.owner_id
    return None if name.isdigit() else name


def usernames(engine: Engine, owner_ids: Iterable[str]) -> dict[str, str]:
    """owner id → user name, for those of *owner_ids* that are users' (others, e.g. ``scheduler``, are absent)."""
    ids = sorted({int(o) for o in owner_ids if o.isdigit() and len(o) < 19})
    with _read(engine) as conn:
        return {str(user_id): name for user_id, name in store.user_names_by_ids(conn, ids).items()}


def list_users(engine: Engine) -> list[User]:
    with _read(engine) as conn:
        return [_public(r) for r in store.user_list(conn)]


def set_password(engine: Engine, user_id: int, password: str) -> None:
    """Replace a user's password. Raises :class:`WeakPassword`, :class:`UserNotFound`."""
    if len(password) < MIN_PASSWORD_LENGTH:
        raise WeakPassword(f"The password must have at least {MIN_PASSWORD_LENGTH} characters.")
    with engine.begin() as conn:
        if not store.user_set_password(conn, user_id, hash_password(password)):
            raise UserNotFound()


def _token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(engine: Engine, user_id: int, name: str) -> tuple[ApiToken, str]:
    """Create an API token for *user_id*.

    Returns: its metadata and the secret — the only time the secret is available.
    Raises: :class:`UserNotFound`, ``ValueError`` when *name* is empty or longer than 100 characters.
    """
    name = name.strip()
    if not name or len(name) > 100:
        raise ValueError("A token name has 1-100 characters.")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with engine.begin() as conn:
        if store.user_get(conn, user_id) is None:
            raise UserNotFound()
        store.token_insert(conn, user_id, name, secret[:10], _token_hash(secret), _now())
        rows = store.token_list_for_user(conn, user_id)
    row = rows[0]  # newest first
    return ApiToken(row.id, row.name, row.prefix, row.created_at, row.last_used_at, row.revoked_at), secret


def list_tokens(engine: Engine, user_id: int) -> list[ApiToken]:
    """The user's tokens, newest first, revoked ones included."""
    with _read(engine) as conn:
        rows = store.token_list_for_user(conn, user_id)
    return [ApiToken(r.id, r.name, r.prefix, r.created_at, r.last_used_at, r.revoked_at) for r in rows]


def revoke_token(engine: Engine, user_id: int, token_id: int) -> None:
    """Revoke one of the user's tokens. Raises :class:`TokenNotFound` (also for another user's token)."""
    with engine.begin() as conn:
        if not store.token_revoke_if_active(conn, token_id, user_id, _now()):
            raise TokenNotFound()


def authenticate_token(engine: Engine, secret: str, *, touch: bool = False) -> User | None:
    """The user of an active token, or ``None``.

    *touch* records ``last_used_at`` (a write; callers rate-limit it, e.g. once a minute per token).
    """
    if not secret.startswith(TOKEN_PREFIX) or len(secret) > 200:
        return None
    with _read(engine) as conn:
        found = store.token_find_active_user(conn, _token_hash(secret))
    if found is None:
        return None
    token_id, row = found
    if touch:
        with engine.begin() as conn:
            store.token_touch(conn, token_id, _now())
    return _public(row)
