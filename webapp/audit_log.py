"""Writing the audit log from the web app (:mod:`accounts.audit` holds the log itself).

:func:`audited` is the one way an operator or admin action runs: it opens one write transaction on
the job database (``jobs.db.write_session``), the view does the action in it (the job, broker,
schedule, settings and accounts services all join a Session or its connection), and the audit row is
written in the same transaction just before it commits — the action and its record commit together
or not at all. When the action is refused or fails, its transaction rolls back and the row saying
so is written alone. :func:`record_event` writes an event that has no other write (a login, a
refused permission, credentials that do not authenticate).

Who and from where come from the request: the caller's user id and name, how they authenticated
(``session``, ``token`` with the token's id, ``basic``), ``request.remote_addr`` (the peer that
connected: behind a proxy, the proxy, as gunicorn sees it) and the User-Agent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from flask import g, has_request_context, request
from sqlalchemy import Connection
from sqlalchemy.orm import Session

from accounts import audit
from jobs.db import session_tx, write_session

from .errors import ApiError
from .services import services

logger = logging.getLogger(__name__)


def entry(
    action: str,
    *,
    outcome: str = "ok",
    target_type: str | None = None,
    target: str | None = None,
    details: dict[str, Any] | None = None,
    reason: str | None = None,
) -> audit.Entry:
    """An audit entry for this request's caller (``g.identity``, if any) and client."""
    found = audit.Entry(
        action,
        outcome=outcome,
        target_type=target_type,
        target=target,
        details=dict(details or {}),
        reason=reason,
    )
    identity = g.get("identity") if has_request_context() else None
    if identity is not None:
        found.actor_id = identity.user.id
        found.actor_name = identity.user.username
        found.via = identity.via
        found.token_id = identity.token.id if identity.token is not None else None
    if has_request_context():
        found.ip = request.remote_addr
        found.user_agent = request.user_agent.string or None
    return found


@dataclass
class Audited:
    """An action in progress: its open transaction and the entry that will record it."""

    session: Session
    entry: audit.Entry

    @property
    def connection(self) -> Connection:
        """The transaction's connection (for services that take a Connection)."""
        return self.session.connection()

    def note(self, **details: Any) -> None:
        """Add *details* (filters, counts, names: never a secret or a payload) to the record."""
        self.entry.details.update(details)

    def after_commit(self, fn: Callable[[], None]) -> None:
        """Run *fn* once the action and its record have committed (wake consumers, say)."""
        session_tx(self.session).after_commit(fn)


@contextmanager
def audited(
    action: str, *, target_type: str | None = None, target: str | None = None, details: dict[str, Any] | None = None
) -> Iterator[Audited]:
    """Run the block as *action*: in one transaction with its audit row (see the module docstring).

    Raises:
      Whatever the block raises, after recording the action as refused (a 403) or failed.
    """
    svc = services()
    svc.jobs.prepare_brokers()  # outside the transaction: a broker's first schema check writes on its own
    record = entry(action, target_type=target_type, target=target, details=details)
    try:
        with write_session(svc.engine) as session:
            yield Audited(session, record)
            audit.record(session.connection(), record)
    except ApiError as exc:
        _alone(record, "refused" if exc.status == 403 else "failed", exc.message)
        raise
    except Exception as exc:
        _alone(record, "failed", f"internal error ({type(exc).__name__})")
        raise


def _alone(record: audit.Entry, outcome: str, reason: str) -> None:
    record.outcome, record.reason = outcome, reason
    try:
        audit.record_alone(services().engine, record)
    except Exception:  # the action's own error is what the caller must see
        logger.exception("Could not record the %s audit entry of %s.", outcome, record.action)


def record_event(action: str, **fields: Any) -> None:
    """Record an event that writes nothing else, in a transaction of its own.

    Raises:
      Whatever the database raises: an event that must be recorded (a login) must not happen unrecorded.
    """
    audit.record_alone(services().engine, entry(action, **fields))
