"""API tokens, users and roles as the API and the UI change them.

Each change runs in one transaction with its audit record (:func:`webapp.audit_log.audited`), and the
accounts layer's refusals become the web layer's errors here, once: a name or action that is not
valid 422, a name taken 409, something missing 404, a built-in role, a role in use or the last user
who may manage users 409, a token asking for more than its creator may do 403.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from sqlalchemy import Connection

import accounts
from accounts import permissions

from .audit_log import audited
from .auth import Identity
from .errors import Conflict, Forbidden, Invalid, NotFound


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except (accounts.UserExists, accounts.RoleExists, accounts.BuiltinRole, accounts.RoleInUse) as exc:
        raise Conflict(str(exc)) from None
    except accounts.LastManager as exc:
        raise Conflict(str(exc)) from None
    except (accounts.UserNotFound, accounts.TokenNotFound) as exc:
        raise NotFound(str(exc)) from None
    except accounts.ActionsExceeded as exc:
        raise Forbidden(str(exc)) from None
    except (
        accounts.InvalidUsername,
        accounts.InvalidRoleName,
        accounts.WeakPassword,
        accounts.UnknownAction,
        accounts.UnknownRole,
    ) as exc:
        raise Invalid(str(exc)) from None
    except ValueError as exc:
        raise Invalid(str(exc)) from None


def _user(conn: Connection, name: str) -> accounts.User:
    found = accounts.get_user_by_name(conn, name)
    if found is None:
        raise NotFound(f"No user named {name!r}.")
    return found


# -- tokens ------------------------------------------------------------------------------------------


def create_token(identity: Identity, name: str, actions: Iterable[str] | None) -> tuple[accounts.ApiToken, str]:
    """A token for the caller carrying *actions* (default: everything the caller may do now).

    A token can carry only what its creator may do now: a token that makes another passes on at most
    its own actions.
    """
    chosen = identity.permissions if actions is None else frozenset(actions)
    with audited("token.create", target_type="token", details={"name": name[:100]}) as act:
        unknown = permissions.unknown(chosen)
        if unknown:
            raise Invalid(f"No such action: {', '.join(unknown)}.")
        beyond = chosen - identity.permissions
        if beyond:
            raise Forbidden(f"A token can carry only what you may do; not: {', '.join(permissions.ordered(beyond))}.")
        with _translated():
            token, secret = accounts.create_token(act.connection, identity.user.id, name, chosen)
        act.entry.target = str(token.id)
        act.note(permissions=permissions.ordered(token.permissions))
    return token, secret


def revoke_token(identity: Identity, token_id: int) -> accounts.ApiToken:
    """Revoke one of the caller's tokens (another user's answers like a missing one)."""
    with audited("token.revoke", target_type="token", target=str(token_id)) as act, _translated():
        token = accounts.revoke_token(act.connection, identity.user.id, token_id)
        act.note(name=token.name)
    return token


# -- users -------------------------------------------------------------------------------------------


def create_user(name: str, role: str, password: str) -> accounts.User:
    with audited("user.create", target_type="user", target=name[:64], details={"role": role}) as act, _translated():
        user, _ = accounts.create_user(act.connection, name, password, role=role)
    return user


def set_role(name: str, role: str) -> str:
    """Give user *name* role *role*; the role they had."""
    with audited("user.role", target_type="user", target=name[:64], details={"to": role}) as act, _translated():
        before = accounts.set_role(act.connection, _user(act.connection, name).id, role)
        act.note(**{"from": before})
    return before


def set_disabled(name: str, disabled: bool) -> None:
    action = "user.disable" if disabled else "user.enable"
    with audited(action, target_type="user", target=name[:64]) as act, _translated():
        accounts.set_disabled(act.connection, _user(act.connection, name).id, disabled)


def set_password(name: str, password: str) -> None:
    with audited("user.password", target_type="user", target=name[:64]) as act, _translated():
        accounts.set_password(act.connection, _user(act.connection, name).id, password)


# -- roles -------------------------------------------------------------------------------------------


def create_role(name: str, description: str, actions: Iterable[str]) -> accounts.Role:
    chosen = sorted(set(actions))
    with audited("role.create", target_type="role", target=name[:64], details={"permissions": chosen}) as act:
        with _translated():
            return accounts.create_role(act.connection, name, description, chosen)


@contextmanager
def _named_role(name: str) -> Iterator[None]:
    """A role named in the path that does not exist is missing (404), not invalid input."""
    try:
        yield
    except accounts.UnknownRole:
        raise NotFound(f"No role named {name!r}.") from None


def update_role(name: str, description: str, actions: Iterable[str]) -> accounts.Role:
    chosen = sorted(set(actions))
    with audited("role.update", target_type="role", target=name[:64], details={"permissions": chosen}) as act:
        with _translated(), _named_role(name):
            before, after = accounts.update_role(act.connection, name, description, chosen)
        act.note(removed=permissions.ordered(before.permissions - after.permissions))
    return after


def delete_role(name: str) -> accounts.Role:
    with audited("role.delete", target_type="role", target=name[:64]) as act, _translated(), _named_role(name):
        return accounts.delete_role(act.connection, name)
