"""The one permission check: every API route, UI page and action, the live feed and ``/metrics``.

Each view names the action it needs with :func:`permission` (the actions: :mod:`accounts.permissions`);
:func:`require` is the check itself, also called directly where a view needs a second action (a bulk
cancel needs ``jobs.bulk`` and ``jobs.cancel``). Two pseudo-actions: :data:`PUBLIC` (no credentials:
the login page, liveness) and :data:`AUTHENTICATED` (any caller: their own identity, the OpenAPI
document). The OpenAPI document shows each operation's action as ``x-permission``
(:func:`webapp.api.document_permissions`), read from the same attribute this decorator sets.

What a caller may do is their role's actions, or for a token those of its actions its user's role
still grants — loaded with the identity on every request, so a role change applies at the next one.
A refusal is 403 and is recorded in the audit log (``refused``, with the action that was missing).

Job visibility: with ``jobs.read_all`` a caller's scope (``Identity.scope``) is every owner
(``None``), otherwise their own jobs; another owner's job then answers exactly like a missing one (404).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from flask import g, has_request_context, request

from accounts import audit

from .audit_log import record_event
from .auth import Identity, require_identity, resolve_identity
from .errors import Forbidden

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

#: No credentials needed.
PUBLIC = "public"
#: Any authenticated caller.
AUTHENTICATED = "authenticated"


def require(action: str, *, audit_as: str | None = None) -> Identity | None:
    """The caller, when they may do *action*; raises otherwise.

    Parameters:
      action: An action name, :data:`PUBLIC` or :data:`AUTHENTICATED`.
      audit_as: The audit action a refused change is recorded as (``{name}`` fields are filled from the
        route's arguments: ``queue.{action}``); a refused read (GET), or a name that is no audit action,
        is recorded as ``access``.

    Raises:
      Unauthorized: No (valid) credentials (401).
      Forbidden: The caller lacks *action* (403; recorded in the audit log).
    """
    if action == PUBLIC:
        return None
    identity = require_identity()
    if action == AUTHENTICATED or action in identity.permissions:
        return identity
    reading = request.method in ("GET", "HEAD")
    recorded = "access" if reading or audit_as is None else audit_as.format_map(request.view_args or {})
    try:
        record_event(
            recorded if recorded in audit.ACTIONS else "access",
            outcome="refused",
            reason=f"needs the {action} permission",
            target_type="route",
            target=f"{request.method} {request.path}",
            details={"permission": action},
        )
    except Exception:  # the refusal stands whatever the log does
        logger.exception("Could not record a refused %s.", action)
    raise Forbidden(f"This needs the {action} permission.")


def permission(action: str, *, audit_as: str | None = None) -> Callable[[F], F]:
    """Decorate a view (function or MethodView method) with the action it needs (see :func:`require`)."""

    def decorate(view: F) -> F:
        @functools.wraps(view)
        def checked(*args: Any, **kwargs: Any) -> Any:
            require(action, audit_as=audit_as)
            return view(*args, **kwargs)

        checked.permission = action  # type: ignore[attr-defined]
        return checked  # type: ignore[return-value]

    return decorate


def can(action: str) -> bool:
    """Whether this request's caller may do *action* (templates hide what they may not)."""
    if not has_request_context():
        return False
    identity = g.get("identity")
    if identity is None:
        try:
            identity = resolve_identity()
        except Exception:
            return False
    return identity is not None and (action == AUTHENTICATED or action in identity.permissions)
