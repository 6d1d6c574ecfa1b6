"""All SQL for accounts: the ``roles``, ``role_permissions``, ``users`` and ``api_tokens`` tables.

Tables (revision ``0002_accounts`` created users and tokens, ``0017_permissions_audit`` added roles;
:data:`metadata` mirrors the head revision for tests):

- ``roles``: a named set of actions (:mod:`accounts.permissions`), its actions one row each in
  ``role_permissions``. ``builtin`` roles (viewer, user, operator, admin) are never changed or deleted.
- ``users``: one row per person. ``role`` names a row of ``roles`` (FK: a role in use cannot go).
  ``password_hash`` is a self-describing scrypt string (``scrypt$n$r$p$salt$hash``); the password
  itself is never stored. ``username`` is unique, compared case-sensitively.
- ``api_tokens``: bearer tokens. Only ``sha256(secret)`` is stored (the secret has 256 bits of
  entropy, so a fast hash is enough and lookups stay one indexed read); ``prefix`` is the first
  characters of the secret, kept so people can tell their tokens apart. ``permissions`` holds the
  actions chosen at creation (space-separated); the token may do those its user's role grants now. A
  revoked token keeps its row with ``revoked_at`` set; it never authenticates again.

Timestamps are integer milliseconds since the epoch (UTC), as in the job and broker tables.

Invariants: a token always belongs to an existing user (FK, ON DELETE CASCADE); ``revoked_at`` is
either NULL or not before ``created_at`` (CHECK); a user's role exists (FK).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Connection,
    Engine,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    delete,
    false,
    func,
    insert,
    select,
    update,
)

#: Names of constraints and indexes, as jobs/models.py names them (Alembic's revisions spell them out).
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: The accounts tables (the migrations create them; tests compare both).
metadata = MetaData(naming_convention=NAMING_CONVENTION)

roles = Table(
    "roles",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("description", String(200), nullable=False, server_default=""),
    Column("builtin", Boolean, nullable=False, default=False, server_default=false()),
    Column("created_at", BigInteger, nullable=False),
)

role_permissions = Table(
    "role_permissions",
    metadata,
    Column("role_id", Integer, ForeignKey("roles.id", ondelete="CASCADE"), primary_key=True),
    Column("action", String(64), primary_key=True),
)

users = Table(
    "users",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("username", String(64), nullable=False, unique=True),
    Column("password_hash", String(255), nullable=False),
    Column("role", String(64), ForeignKey("roles.name"), nullable=False),
    Column("disabled", Boolean, nullable=False, default=False, server_default=false()),
    Column("created_at", BigInteger, nullable=False),
    Index("ix_users_role", "role"),
)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user_id", Integer, ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    Column("name", String(100), nullable=False),
    Column("prefix", String(16), nullable=False),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("created_at", BigInteger, nullable=False),
    Column("last_used_at", BigInteger, nullable=True),
    Column("revoked_at", BigInteger, nullable=True),
    Column("permissions", String(1000), nullable=False, server_default=""),
    CheckConstraint("revoked_at IS NULL OR revoked_at >= created_at", name="revoked_after_created"),
    Index("ix_api_tokens_user_id", "user_id"),
)


@dataclass(frozen=True)
class UserRow:
    id: int
    username: str
    password_hash: str
    role: str
    disabled: bool
    created_at: datetime


@dataclass(frozen=True)
class TokenRow:
    id: int
    user_id: int
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None
    permissions: frozenset[str]


@dataclass(frozen=True)
class RoleRow:
    id: int
    name: str
    description: str
    builtin: bool
    created_at: datetime
    permissions: frozenset[str]
    users: int


def _utc(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def _ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def _user(row) -> UserRow:  # type: ignore[no-untyped-def]
    return UserRow(row.id, row.username, row.password_hash, row.role, bool(row.disabled), _utc(row.created_at))


def _actions(text: str | None) -> frozenset[str]:
    return frozenset((text or "").split())


def _token(row) -> TokenRow:  # type: ignore[no-untyped-def]
    return TokenRow(
        row.id,
        row.user_id,
        row.name,
        row.prefix,
        _utc(row.created_at),
        _utc(row.last_used_at),
        _utc(row.revoked_at),
        _actions(row.permissions),
    )


def reading(engine: Engine) -> Connection:
    """A read-only connection: with the job layer's engines (jobs.db.make_engine) it opens a deferred
    ``BEGIN`` instead of ``BEGIN IMMEDIATE``, so logins, token checks and log pages never wait for the
    writer."""
    return engine.connect().execution_options(tenure_readonly=True)  # == jobs.db.READONLY


_USER_COLS = (users.c.id, users.c.username, users.c.password_hash, users.c.role, users.c.disabled, users.c.created_at)
_TOKEN_COLS = (
    api_tokens.c.id,
    api_tokens.c.user_id,
    api_tokens.c.name,
    api_tokens.c.prefix,
    api_tokens.c.created_at,
    api_tokens.c.last_used_at,
    api_tokens.c.revoked_at,
    api_tokens.c.permissions,
)


# -- roles ---------------------------------------------------------------------------------------------


def role_actions(conn: Connection, role: str) -> frozenset[str]:
    """The actions role *role* grants (none for a role that does not exist)."""
    query = (
        select(role_permissions.c.action)
        .join(roles, roles.c.id == role_permissions.c.role_id)
        .where(roles.c.name == role)
    )
    return frozenset(str(a) for a in conn.execute(query).scalars())


def role_list(conn: Connection) -> list[RoleRow]:
    """Every role, built-in ones first, then by name, with its actions and how many users hold it."""
    granted: dict[int, set[str]] = {}
    for role_id, action in conn.execute(select(role_permissions.c.role_id, role_permissions.c.action)):
        granted.setdefault(int(role_id), set()).add(str(action))
    holders = {str(role): int(n) for role, n in conn.execute(select(users.c.role, func.count()).group_by(users.c.role))}
    query = select(roles).order_by(roles.c.builtin.desc(), roles.c.name)
    return [
        RoleRow(
            r.id,
            r.name,
            r.description,
            bool(r.builtin),
            _utc(r.created_at),  # type: ignore[arg-type]
            frozenset(granted.get(r.id, ())),
            int(holders.get(r.name, 0)),
        )
        for r in conn.execute(query)
    ]


def role_get(conn: Connection, name: str) -> RoleRow | None:
    return next((r for r in role_list(conn) if r.name == name), None)


def role_insert(conn: Connection, name: str, description: str, now: datetime) -> int:
    result = conn.execute(insert(roles).values(name=name, description=description, builtin=False, created_at=_ms(now)))
    return int(result.inserted_primary_key[0])


def role_set(conn: Connection, role_id: int, description: str, actions: frozenset[str]) -> None:
    """Replace a role's description and actions."""
    conn.execute(update(roles).where(roles.c.id == role_id).values(description=description))
    conn.execute(delete(role_permissions).where(role_permissions.c.role_id == role_id))
    if actions:
        conn.execute(insert(role_permissions), [{"role_id": role_id, "action": a} for a in sorted(actions)])


def role_delete(conn: Connection, role_id: int) -> None:
    conn.execute(delete(roles).where(roles.c.id == role_id, roles.c.builtin.is_(False)))


def users_with_action(conn: Connection, action: str) -> int:
    """How many active users hold a role that grants *action*."""
    query = (
        select(func.count())
        .select_from(users)
        .join(roles, roles.c.name == users.c.role)
        .join(role_permissions, role_permissions.c.role_id == roles.c.id)
        .where(users.c.disabled.is_(False), role_permissions.c.action == action)
    )
    return int(conn.execute(query).scalar_one())


# -- users ---------------------------------------------------------------------------------------------


def user_insert(conn: Connection, username: str, password_hash: str, role: str, now: datetime) -> int:
    result = conn.execute(
        insert(users).values(
            username=username, password_hash=password_hash, role=role, disabled=False, created_at=_ms(now)
        )
    )
    return int(result.inserted_primary_key[0])


def user_get(conn: Connection, user_id: int) -> UserRow | None:
    row = conn.execute(select(*_USER_COLS).where(users.c.id == user_id)).first()
    return _user(row) if row else None


def user_get_by_name(conn: Connection, username: str) -> UserRow | None:
    row = conn.execute(select(*_USER_COLS).where(users.c.username == username)).first()
    return _user(row) if row else None


def user_names_by_ids(conn: Connection, user_ids: list[int]) -> dict[int, str]:
    """id → user name of those of *user_ids* that exist (disabled users included)."""
    if not user_ids:
        return {}
    query = select(users.c.id, users.c.username).where(users.c.id.in_(user_ids))
    return {int(row.id): str(row.username) for row in conn.execute(query)}


def user_list(conn: Connection) -> list[UserRow]:
    return [_user(r) for r in conn.execute(select(*_USER_COLS).order_by(users.c.id))]


def user_count_admins(conn: Connection) -> int:
    query = select(func.count()).select_from(users).where(users.c.role == "admin", users.c.disabled.is_(False))
    return int(conn.execute(query).scalar_one())


def user_set_password(conn: Connection, user_id: int, password_hash: str) -> bool:
    result = conn.execute(update(users).where(users.c.id == user_id).values(password_hash=password_hash))
    return result.rowcount == 1


def user_set_disabled(conn: Connection, user_id: int, disabled: bool) -> bool:
    result = conn.execute(update(users).where(users.c.id == user_id).values(disabled=disabled))
    return result.rowcount == 1


def user_set_role(conn: Connection, user_id: int, role: str) -> bool:
    result = conn.execute(update(users).where(users.c.id == user_id).values(role=role))
    return result.rowcount == 1


# -- tokens --------------------------------------------------------------------------------------------


def token_insert(
    conn: Connection, user_id: int, name: str, prefix: str, token_hash: str, now: datetime, actions: frozenset[str]
) -> int:
    result = conn.execute(
        insert(api_tokens).values(
            user_id=user_id,
            name=name,
            prefix=prefix,
            token_hash=token_hash,
            created_at=_ms(now),
            permissions=" ".join(sorted(actions)),
        )
    )
    return int(result.inserted_primary_key[0])


def token_get(conn: Connection, token_id: int) -> TokenRow | None:
    row = conn.execute(select(*_TOKEN_COLS).where(api_tokens.c.id == token_id)).first()
    return _token(row) if row else None


def token_list_for_user(conn: Connection, user_id: int) -> list[TokenRow]:
    query = select(*_TOKEN_COLS).where(api_tokens.c.user_id == user_id).order_by(api_tokens.c.id.desc())
    return [_token(r) for r in conn.execute(query)]


def token_find_active_user(conn: Connection, token_hash: str) -> tuple[TokenRow, UserRow] | None:
    """The (token, user) of an unrevoked token whose owner is not disabled."""
    query = (
        select(
            *_TOKEN_COLS,
            users.c.username,
            users.c.password_hash,
            users.c.role,
            users.c.disabled,
            users.c.created_at.label("user_created_at"),
        )
        .join(users, users.c.id == api_tokens.c.user_id)
        .where(api_tokens.c.token_hash == token_hash, api_tokens.c.revoked_at.is_(None), users.c.disabled.is_(False))
    )
    row = conn.execute(query).first()
    if row is None:
        return None
    user = UserRow(
        row.user_id, row.username, row.password_hash, row.role, bool(row.disabled), _utc(row.user_created_at)
    )
    return _token(row), user  # type: ignore[arg-type]


def token_touch(conn: Connection, token_id: int, now: datetime) -> None:
    conn.execute(update(api_tokens).where(api_tokens.c.id == token_id).values(last_used_at=_ms(now)))


def token_revoke_if_active(conn: Connection, token_id: int, user_id: int, now: datetime) -> bool:
    """Revoke one of *user_id*'s tokens; False when it does not exist, is not theirs, or is already revoked."""
    result = conn.execute(
        update(api_tokens)
        .where(api_tokens.c.id == token_id, api_tokens.c.user_id == user_id, api_tokens.c.revoked_at.is_(None))
        .values(revoked_at=_ms(now))
    )
    return result.rowcount == 1
