"""Live notifications: small notices handed to in-process subscribers after the transaction commits.

A notice says *that* a job changed (its id, owner, status, event sequence); subscribers re-read what
they need through :mod:`jobs.queries`. Notices never carry payloads, results, paths or errors, so
fanning them out (e.g. to a websocket) cannot leak anything the reader is not allowed to see.

Notices raised inside a transaction are buffered: delivered after the outermost commit, dropped
by a rollback. With a caller's :class:`sqlalchemy.orm.Session`, a notice raised inside a savepoint
is dropped if that savepoint rolls back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Notice:
    """Job *job_id* (of *owner_id*) changed: ``type`` is ``status``, ``progress`` or ``event``."""

    job_id: str
    owner_id: str
    type: str
    status: str
    sequence: int


Subscriber = Callable[[Notice], None]


class Hub:
    """Subscribers of one process. Delivery is synchronous and a failing subscriber is only logged."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[Subscriber] = []

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Register *callback*; returns a function that unsubscribes it."""
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def publish(self, notices: list[Notice]) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for notice in notices:
            for callback in subscribers:
                try:
                    callback(notice)
                except Exception:
                    logger.exception("Notice subscriber %r failed.", callback)


#: The process-wide hub.
hub = Hub()


class NoticeBuffer:
    """Notices of one transaction the job layer opened itself (see :func:`jobs.db.write`)."""

    __slots__ = ("_notices",)

    def __init__(self) -> None:
        self._notices: list[Notice] = []

    def add(self, notice: Notice) -> None:
        self._notices.append(notice)

    def deliver(self) -> None:
        notices, self._notices = self._notices, []
        if notices:
            hub.publish(notices)


_SESSION_KEY = "tenure_notices"


class SessionNotices:
    """Notices raised inside a caller's Session: delivered after its outermost commit.

    Each notice remembers the (possibly nested) SessionTransaction it was raised in; rolling back
    that transaction or any ancestor drops it.
    """

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session
        if _SESSION_KEY not in session.info:
            session.info[_SESSION_KEY] = []
            event.listen(session, "after_commit", _after_commit)
            event.listen(session, "after_soft_rollback", _after_soft_rollback)

    def add(self, notice: Notice) -> None:
        trans = self._session.get_nested_transaction() or self._session.get_transaction()
        self._session.info[_SESSION_KEY].append((trans, notice))


def _after_commit(session: Session) -> None:
    pending = session.info.get(_SESSION_KEY) or []
    session.info[_SESSION_KEY] = []
    notices = [n for _, n in pending]
    if notices:
        hub.publish(notices)


def _descends(trans: Any, ancestor: SessionTransaction) -> bool:
    while trans is not None:
        if trans is ancestor:
            return True
        trans = trans.parent
    return False


def _after_soft_rollback(session: Session, previous_transaction: SessionTransaction) -> None:
    pending = session.info.get(_SESSION_KEY) or []
    session.info[_SESSION_KEY] = [(t, n) for t, n in pending if not _descends(t, previous_transaction)]
