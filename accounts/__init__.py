"""Accounts: users, roles (named sets of actions), passwords and API tokens; the audit log beside them.

The web app authenticates people with these functions and the CLI creates them
(``tenure users create NAME --role operator``, ``tenure users ensure-admin``). No Flask here: the CLI
and workers may import this module. All SQL lives in :mod:`accounts.store` (the audit log's in
:mod:`accounts.audit_store`).

Roles and actions: :mod:`accounts.permissions` names the actions; a role grants a set of them (the
built-in viewer, user, operator and admin cannot be changed or deleted; an admin defines more). A user
has one role. An API token carries a subset of its user's actions chosen at creation (default: all of
them); it may do what that subset and its user's role *now* both allow.

Writes take an Engine (their own transaction) or a Connection inside the caller's open transaction
(nothing is committed here; a refused step rolls back to a savepoint and leaves the caller's
transaction usable), so the caller can write the audit row (:mod:`accounts.audit`) in the same
transaction as the change it records.

Passwords are hashed with scrypt (``hashlib.scrypt``; n=2**15 unless the web process sets another,
r=8, p=1, 16-byte salt), stored as ``scrypt$n$r$p$salt_hex$hash_hex`` so the cost can change later
without breaking old hashes.
API tokens are ``tnr_`` + 43 url-safe characters (256 bits); only their SHA-256 is stored, and the
secret is returned exactly once, by :func:`create_token`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError

from . import audit, permissions, store
from .store import reading as _read

#: scrypt cost parameters for new hashes (≈ 50 ms on a laptop core; 32 MiB of memory). The web process
#: may lower N (:func:`set_scrypt_cost`); hashes carry their own parameters, so old ones still verify.
SCRYPT_N = 2**15
#: The range :func:`set_scrypt_cost` accepts: below 2**10 a hash is cheap to brute-force offline.
SCRYPT_N_RANGE = (2**10, 2**20)
SCRYPT_R = 8
SCRYPT_P = 1
#: Passwords shorter than this are refused.
MIN_PASSWORD_LENGTH = 10
TOKEN_PREFIX = "tnr_"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: What a token's name is stripped of (the ASCII blanks, as ``\s`` means in every regex dialect).
BLANKS = " \t\n\r\f\v"
#: The action an account that manages the others needs; the last active holder keeps it.
MANAGE_USERS = "users.manage"


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


class UnknownRole(AccountError, ValueError):
    """No such role."""


class RoleExists(AccountError):
    """A role with this name already exists."""


class InvalidRoleName(AccountError):
    """A role name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit."""


class BuiltinRole(AccountError):
    """The built-in roles (viewer, user, operator, admin) cannot be changed or deleted."""


class RoleInUse(AccountError):
    """Users hold this role; give them another one first."""


class UnknownAction(AccountError, ValueError):
    """No such action."""


class ActionsExceeded(AccountError):
    """A token can only carry actions its user's role grants."""


class LastManager(AccountError):
    """This would leave no active user who may manage users."""


@dataclass(frozen=True)
class User:
    """A user as the rest of Tenure sees it (no password hash), with the actions their role grants."""

    id: int
    username: str
    role: str
    disabled: bool
    created_at: datetime
    permissions: frozenset[str] = frozenset()

    @property
    def is_admin(self) -> bool:
        """Whether the user holds the built-in admin role (what the app allows is :attr:`permissions`)."""
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
    #: The actions chosen when it was created (what it may do is these ∩ its user's role now).
    permissions: frozenset[str] = frozenset()

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True)
class TokenIdentity:
    """Who a token authenticates: its user, the token, and what it may do now (token ∩ role)."""

    user: User
    token: ApiToken
    permissions: frozenset[str]


@dataclass(frozen=True)
class Role:
    name: str
    description: str
    builtin: bool
    permissions: frozenset[str]
    #: How many users hold it.
    users: int
    created_at: datetime


def _now() -> datetime:
    return datetime.now(UTC)


@contextmanager
def _writing(target: Engine | Connection) -> Iterator[Connection]:
    """A transaction of its own (Engine), or a savepoint inside the caller's (Connection)."""
    if isinstance(target, Connection):
        with target.begin_nested():
            yield target
    else:
        with target.begin() as conn:
            yield conn


@contextmanager
def _reading(target: Engine | Connection) -> Iterator[Connection]:
    if isinstance(target, Connection):
        yield target
    else:
        with _read(target) as conn:
            yield conn


def valid_name(name: str) -> bool:
    """Whether *name* may name a user or a role (the whole of it: a trailing newline is no part of a name)."""
    return _NAME_RE.fullmatch(name) is not None


def _public(row: store.UserRow, actions: frozenset[str]) -> User:
    return User(row.id, row.username, row.role, row.disabled, row.created_at, actions)


def _user(conn: Connection, row: store.UserRow) -> User:
    return _public(row, store.role_actions(conn, row.role))


def _token(row: store.TokenRow) -> ApiToken:
    return ApiToken(row.id, row.name, row.prefix, row.created_at, row.last_used_at, row.revoked_at, row.permissions)


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


def set_scrypt_cost(n: int) -> None:
    """Hash new passwords of this process with scrypt cost *n*: a power of two in :data:`SCRYPT_N_RANGE`.

    Raises:
      ValueError: *n* is not such a power of two.
    """
    low, high = SCRYPT_N_RANGE
    if not (low <= n <= high and n & (n - 1) == 0):
        raise ValueError(f"the scrypt cost must be a power of two from {low} to {high}, not {n}")
    global SCRYPT_N
    SCRYPT_N = n


def _dummy_hash() -> str:
    """Verified against when the user does not exist, so a wrong name costs as much time as a wrong password."""
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${'00' * 16}${'00' * 64}"


def generate_password() -> str:
    """A random password for generated accounts (20 url-safe characters, ~120 bits)."""
    return secrets.token_urlsafe(15)


def create_user(
    target: Engine | Connection, username: str, password: str | None = None, *, role: str = "user"
) -> tuple[User, str]:
    """Create a user.

    Parameters: *target* an Engine, or a Connection in the caller's transaction. *password* ``None``
    generates one. *role* names an existing role.
    Raises: :class:`InvalidUsername`, :class:`WeakPassword`, :class:`UserExists`, :class:`UnknownRole`
    (a ``ValueError``).
    Returns: the user and the password (the generated one, or the one given).
    """
    if not valid_name(username):
        raise InvalidUsername()
    password = generate_password() if password is None else password
    if len(password) < MIN_PASSWORD_LENGTH:
        raise WeakPassword(f"The password must have at least {MIN_PASSWORD_LENGTH} characters.")
    hashed = hash_password(password)
    try:
        with _writing(target) as conn:
            if store.role_get(conn, role) is None:
                raise UnknownRole(f"No role named {role!r}.")
            user_id = store.user_insert(conn, username, hashed, role, _now())
            row = store.user_get(conn, user_id)
            assert row is not None
            user = _user(conn, row)
    except IntegrityError as exc:
        raise UserExists(f"A user named {username!r} already exists.") from exc
    return user, password


def ensure_admin(
    engine: Engine, username: str = "admin", *, entry: audit.Entry | None = None
) -> tuple[User, str] | None:
    """Create *username* as an admin with a random password if there is no active admin yet.

    Parameters: *entry* an audit entry to record the creation with, in its transaction (its target is
    set to the name given).
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
        if entry is None:
            return create_user(engine, username, role="admin")
        entry.target_type, entry.target, entry.details = "user", username, {"role": "admin"}
        with audit.recorded(engine, entry) as conn:
            return create_user(conn, username, role="admin")
    except UserExists:
        return None  # another process created it at the same moment


def authenticate(engine: Engine, username: str, password: str) -> User | None:
    """The active user with this name and password, or ``None`` (same cost either way)."""
    with _read(engine) as conn:
        row = store.user_get_by_name(conn, username)
        actions = store.role_actions(conn, row.role) if row is not None else frozenset()
    if row is None:
        verify_password(password, _dummy_hash())
        return None
    if not verify_password(password, row.password_hash) or row.disabled:
        return None
    return _public(row, actions)


def get_user(engine: Engine, user_id: int) -> User | None:
    """The active user with this id, or ``None`` (disabled users count as missing)."""
    with _read(engine) as conn:
        row = store.user_get(conn, user_id)
        return _user(conn, row) if row and not row.disabled else None


def get_user_by_name(target: Engine | Connection, username: str) -> User | None:
    """The user with this name (disabled users included), or ``None``."""
    with _reading(target) as conn:
        row = store.user_get_by_name(conn, username)
        return _user(conn, row) if row else None


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
        rows = store.user_list(conn)
        actions = {r.name: r.permissions for r in store.role_list(conn)}
    return [_public(r, actions.get(r.role, frozenset())) for r in rows]


def set_password(target: Engine | Connection, user_id: int, password: str) -> None:
    """Replace a user's password. Raises :class:`WeakPassword`, :class:`UserNotFound`."""
    if len(password) < MIN_PASSWORD_LENGTH:
        raise WeakPassword(f"The password must have at least {MIN_PASSWORD_LENGTH} characters.")
    with _writing(target) as conn:
        if not store.user_set_password(conn, user_id, hash_password(password)):
            raise UserNotFound()


def _keep_a_manager(conn: Connection) -> None:
    if store.users_with_action(conn, MANAGE_USERS) == 0:
        raise LastManager()


def set_role(target: Engine | Connection, user_id: int, role: str) -> str:
    """Give a user another role; the role they had.

    Raises: :class:`UserNotFound`, :class:`UnknownRole`, :class:`LastManager` (nothing changed).
    """
    with _writing(target) as conn:
        row = store.user_get(conn, user_id)
        if row is None:
            raise UserNotFound()
        if store.role_get(conn, role) is None:
            raise UnknownRole(f"No role named {role!r}.")
        store.user_set_role(conn, user_id, role)
        _keep_a_manager(conn)
    return row.role


def set_disabled(target: Engine | Connection, user_id: int, disabled: bool) -> None:
    """Disable a user (they can no longer log in; their tokens stop working) or enable them again.

    Raises: :class:`UserNotFound`, :class:`LastManager` (nothing changed).
    """
    with _writing(target) as conn:
        if not store.user_set_disabled(conn, user_id, disabled):
            raise UserNotFound()
        _keep_a_manager(conn)


def _role(row: store.RoleRow) -> Role:
    return Role(row.name, row.description, row.builtin, row.permissions, row.users, row.created_at)


def list_roles(target: Engine | Connection) -> list[Role]:
    """Every role (built-in ones first), with its actions and how many users hold it."""
    with _reading(target) as conn:
        return [_role(r) for r in store.role_list(conn)]


def get_role(target: Engine | Connection, name: str) -> Role | None:
    with _reading(target) as conn:
        row = store.role_get(conn, name)
    return _role(row) if row else None


def _checked_actions(actions: Iterable[str]) -> frozenset[str]:
    chosen = frozenset(actions)
    unknown = permissions.unknown(chosen)
    if unknown:
        raise UnknownAction(f"No such action: {', '.join(unknown)}.")
    return chosen


def _description(text: str) -> str:
    text = text.strip()
    if len(text) > 200:
        raise ValueError("A role's description has at most 200 characters.")
    return text


def create_role(target: Engine | Connection, name: str, description: str, actions: Iterable[str]) -> Role:
    """Define a role.

    Raises: :class:`InvalidRoleName`, :class:`UnknownAction`, :class:`RoleExists`, ``ValueError`` (description).
    """
    if not valid_name(name):
        raise InvalidRoleName()
    chosen, text = _checked_actions(actions), _description(description)
    try:
        with _writing(target) as conn:
            role_id = store.role_insert(conn, name, text, _now())
            store.role_set(conn, role_id, text, chosen)
            row = store.role_get(conn, name)
    except IntegrityError as exc:
        raise RoleExists(f"A role named {name!r} already exists.") from exc
    assert row is not None
    return _role(row)


def _own_role(conn: Connection, name: str) -> store.RoleRow:
    """The role an admin defined named *name*, to change or delete.

    Raises: :class:`UnknownRole`, :class:`BuiltinRole`.
    """
    row = store.role_get(conn, name)
    if row is None:
        raise UnknownRole(f"No role named {name!r}.")
    if row.builtin:
        raise BuiltinRole()
    return row


def update_role(target: Engine | Connection, name: str, description: str, actions: Iterable[str]) -> tuple[Role, Role]:
    """Replace a role's description and actions (its users get the new set at their next request);
    the role before and after.

    Raises: :class:`UnknownRole`, :class:`BuiltinRole`, :class:`UnknownAction`, :class:`LastManager`.
    """
    chosen, text = _checked_actions(actions), _description(description)
    with _writing(target) as conn:
        before = _own_role(conn, name)
        store.role_set(conn, before.id, text, chosen)
        _keep_a_manager(conn)
        after = store.role_get(conn, name)
    assert after is not None
    return _role(before), _role(after)


def delete_role(target: Engine | Connection, name: str) -> Role:
    """Delete a role nobody holds; the role as it was.

    Raises: :class:`UnknownRole`, :class:`BuiltinRole`, :class:`RoleInUse`.
    """
    with _writing(target) as conn:
        row = _own_role(conn, name)
        if row.users:
            raise RoleInUse(f"{row.users} user(s) hold the role {name!r}; give them another role first.")
        store.role_delete(conn, row.id)
    return _role(row)


def _token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(
    target: Engine | Connection, user_id: int, name: str, actions: Iterable[str] | None = None
) -> tuple[ApiToken, str]:
    """Create an API token for *user_id* carrying *actions* (default: every action of the user's role).

    Returns: its metadata and the secret — the only time the secret is available.
    Raises: :class:`UserNotFound`, :class:`UnknownAction`, :class:`ActionsExceeded` (an action the
    user's role does not grant), ``ValueError`` when *name* is empty or longer than 100 characters.
    """
    name = name.strip(BLANKS)
    if not name or len(name) > 100:
        raise ValueError("A token name has 1-100 characters.")
    chosen = None if actions is None else _checked_actions(actions)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with _writing(target) as conn:
        user = store.user_get(conn, user_id)
        if user is None:
            raise UserNotFound()
        granted = store.role_actions(conn, user.role)
        if chosen is None:
            chosen = granted
        elif not chosen <= granted:
            extra = ", ".join(permissions.ordered(chosen - granted))
            raise ActionsExceeded(f"The role {user.role!r} does not grant: {extra}.")
        token_id = store.token_insert(conn, user_id, name, secret[:10], _token_hash(secret), _now(), chosen)
        row = store.token_get(conn, token_id)
    assert row is not None
    return _token(row), secret


def list_tokens(engine: Engine, user_id: int) -> list[ApiToken]:
    """The user's tokens, newest first, revoked ones included."""
    with _read(engine) as conn:
        rows = store.token_list_for_user(conn, user_id)
    return [_token(r) for r in rows]


def revoke_token(target: Engine | Connection, user_id: int, token_id: int) -> ApiToken:
    """Revoke one of the user's tokens; the token. Raises :class:`TokenNotFound` (also for another user's token)."""
    with _writing(target) as conn:
        if not store.token_revoke_if_active(conn, token_id, user_id, _now()):
            raise TokenNotFound()
        row = store.token_get(conn, token_id)
    assert row is not None
    return _token(row)


def token_identity(engine: Engine, secret: str, *, touch: bool = False) -> TokenIdentity | None:
    """Who an active token authenticates and what it may do now, or ``None``.

    *touch* records ``last_used_at`` (a write; callers rate-limit it, e.g. once a minute per token).
    """
    if not secret.startswith(TOKEN_PREFIX) or len(secret) > 200:
        return None
    with _read(engine) as conn:
        found = store.token_find_active_user(conn, _token_hash(secret))
        if found is None:
            return None
        token_row, user_row = found
        user = _user(conn, user_row)
    if touch:
        with engine.begin() as conn:
            store.token_touch(conn, token_row.id, _now())
    return TokenIdentity(user, _token(token_row), token_row.permissions & user.permissions)


def authenticate_token(engine: Engine, secret: str, *, touch: bool = False) -> User | None:
    """The user of an active token, or ``None`` (what the token may do: :func:`token_identity`)."""
    found = token_identity(engine, secret, touch=touch)
    return None if found is None else found.user
