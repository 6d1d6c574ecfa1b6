"""What a transaction does once it has committed, and the lifecycle events it tells observers.

A job transition queues its after-commit work on the transaction (:meth:`jobs.db.Tx.after_commit`):
it runs after the outermost commit and is dropped by a rollback. With a caller's
:class:`sqlalchemy.orm.Session`, work queued inside a savepoint is dropped if that savepoint rolls
back. The main after-commit work is a lifecycle event: ``job.queued``, ``job.started``,
``job.completed``, ``job.failed``… with the job's id, kind and attempt (never a payload, result or
error text). Monitoring counts them into metrics through :data:`observers` and formats the log
lines of the ``tenure.lifecycle`` logger; the job layer cannot import monitoring, so it speaks
plain logging and a list of callables.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

logger = logging.getLogger(__name__)

#: The logger lifecycle events are written to.
lifecycle_logger = logging.getLogger("tenure.lifecycle")

#: Callables told of every lifecycle event (its fields, as logged): monitoring counts its metrics here,
#: so counting does not depend on the log level.
observers: list[Callable[[dict[str, Any]], None]] = []

#: Events logged at DEBUG: one line per queued, started and succeeded job doubled the CPU cost of a short
#: job (a log record through Dramatiq's log pipe costs more than the job's own database writes);
#: failures, retries, cancellations, recoveries and stale writes stay at INFO.
QUIET_EVENTS = frozenset({"job.queued", "job.started", "job.completed"})
#: Marks a record whose event the observers already saw (so a log handler does not count it twice).
OBSERVED = "tenure_observed"

AfterCommit = Callable[[], None]


def lifecycle(
    event_name: str,
    job_id: str,
    kind: str,
    attempt: int,
    *,
    outcome: str | None = None,
    duration_s: float | None = None,
) -> None:
    """Tell the observers and the lifecycle log of one event (call it after the commit that made it true)."""
    level = logging.DEBUG if event_name in QUIET_EVENTS else logging.INFO
    logged = lifecycle_logger.isEnabledFor(level)
    if not observers and not logged:
        return
    fields: dict[str, Any] = {"event": event_name, "job_id": job_id, "kind": kind, "attempt": attempt}
    if outcome is not None:
        fields["outcome"] = outcome
    if duration_s is not None:
        fields["duration_s"] = round(duration_s, 6)
    for observe in list(observers):
        try:
            observe(fields)
        except Exception:
            logger.exception("A lifecycle observer failed on %s.", event_name)
    if logged:
        lifecycle_logger.log(
            level,
            "%s job=%s kind=%s attempt=%d",
            event_name,
            job_id,
            kind,
            attempt,
            extra={"tenure": fields, OBSERVED: bool(observers)},
        )


def _run(work: list[AfterCommit]) -> None:
    for fn in work:
        try:
            fn()
        except Exception:
            logger.exception("After-commit work %r failed.", fn)


class AfterCommitBuffer:
    """After-commit work of one transaction the job layer opened itself (see :func:`jobs.db.write`)."""

    __slots__ = ("_work",)

    def __init__(self) -> None:
        self._work: list[AfterCommit] = []

    def add(self, fn: AfterCommit) -> None:
        self._work.append(fn)

    def run(self) -> None:
        """Run the queued work once (after the commit); a second call runs nothing."""
        work, self._work = self._work, []
        _run(work)


_SESSION_KEY = "tenure_after_commit"


class SessionAfterCommit:
    """After-commit work queued inside a caller's Session: run after its outermost commit.

    Each item remembers the (possibly nested) SessionTransaction it was queued in; rolling back that
    transaction or any ancestor drops it.
    """

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session
        if _SESSION_KEY not in session.info:
            session.info[_SESSION_KEY] = []
            event.listen(session, "after_commit", _after_commit)
            event.listen(session, "after_soft_rollback", _after_soft_rollback)

    def add(self, fn: AfterCommit) -> None:
        trans = self._session.get_nested_transaction() or self._session.get_transaction()
        self._session.info[_SESSION_KEY].append((trans, fn))


def _after_commit(session: Session) -> None:
    pending = session.info.get(_SESSION_KEY) or []
    session.info[_SESSION_KEY] = []
    _run([fn for _, fn in pending])


def _descends(trans: Any, ancestor: SessionTransaction) -> bool:
    while trans is not None:
        if trans is ancestor:
            return True
        trans = trans.parent
    return False


def _after_soft_rollback(session: Session, previous_transaction: SessionTransaction) -> None:
    pending = session.info.get(_SESSION_KEY) or []
    session.info[_SESSION_KEY] = [(t, fn) for t, fn in pending if not _descends(t, previous_transaction)]
