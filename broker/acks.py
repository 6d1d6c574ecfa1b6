"""Group-committed acks and nacks.

Worker threads hand their acks to one writer thread per process, which commits everything that
arrived meanwhile in one ``BEGIN IMMEDIATE`` transaction: one fsync and one write-lock round per
batch instead of per message. A crash before the commit means the message is delivered again after
its lease expires, which at-least-once delivery allows. Every statement is fenced on
``(id, owner, deliveries)``; a statement that matches nothing is a lost lease and is reported.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dramatiq.common import current_millis

from .errors import DatabaseUnavailable
from .store import MessageStore

logger = logging.getLogger(__name__)

#: Delay before retrying a batch after the database was unavailable, in seconds.
RETRY_DELAY_S = 0.5


#: Work a caller attached to a message's ack (see ``SQLiteMessageProxy.in_ack_transaction``): run with
#: the ack's connection inside its transaction; what it returns (if anything) runs after the commit.
AckHook = Callable[[sqlite3.Connection], Callable[[], None] | None]


@dataclass(frozen=True)
class Settlement:
    """One ack (``body is None and not dead``) or nack to commit, with the hooks attached to it.

    ``settle=False``: the message was already given back (shutdown); only its hooks run.
    """

    row_id: int
    deliveries: int
    message_id: str
    dead: bool = False
    body: bytes | None = None
    reason: str = ""
    hooks: tuple[AckHook, ...] = ()
    settle: bool = True


class Call:
    """A write another layer runs in the next ack batch and waits for (see ``SQLiteBroker.write_with_acks``)."""

    __slots__ = ("fn", "done", "result", "error", "after")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def wait(self) -> Any:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


class AckWriter:
    def __init__(
        self, store: MessageStore, owner: str, on_lost: Callable[[Settlement], None], on_done: Callable[[], None]
    ) -> None:
        self._store = store
        self._owner = owner
        self._on_lost = on_lost
        self._on_done = on_done
        self._pending: deque[Settlement | Call] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="tenure-broker-acks", daemon=True)
        self._thread.start()

    def submit(self, settlement: Settlement | Call) -> None:
        with self._cond:
            if isinstance(settlement, Call) and (self._stopped or not self._thread.is_alive()):
                # Nobody would run it: fail the caller now rather than let it wait forever.
                settlement.error = DatabaseUnavailable("the broker's ack writer has stopped")
                settlement.done.set()
                return
            self._pending.append(settlement)
            self._cond.notify_all()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything submitted so far is committed (or given up on shutdown)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(min(remaining, 0.05))
        return True

    def stop(self, timeout_s: float = 30.0) -> bool:
        flushed = self.flush(timeout_s)
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=1.0)
        if not flushed:
            logger.warning(
                "%d acks were not committed before shutdown; those messages will run again.", len(self._pending)
            )
        return flushed

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    self._cond.wait(1.0)
                if not self._pending and self._stopped:
                    return
                batch = list(self._pending)
                self._pending.clear()
                self._busy = True
            try:
                lost = self._commit(batch)
            except DatabaseUnavailable as e:
                logger.warning("Could not commit %d acks (%s); retrying in %.1fs.", len(batch), e, RETRY_DELAY_S)
                with self._cond:
                    self._pending.extendleft(reversed(batch))
                    self._busy = False
                    self._cond.notify_all()
                time.sleep(RETRY_DELAY_S)
                continue
            except Exception as e:
                logger.exception("Unexpected error committing %d acks; their messages will run again.", len(batch))
                lost = []
                for item in batch:
                    if isinstance(item, Call) and not item.done.is_set():
                        item.error = e
                        item.done.set()
            with self._cond:
                self._busy = False
                self._cond.notify_all()
            for settlement in lost:
                self._on_lost(settlement)
            self._on_done()

    def _commit(self, batch: list[Settlement | Call]) -> list[Settlement]:
        lost = []
        after: list[Callable[[], None]] = []
        calls: list[Call] = []
        now = current_millis()
        with self._store.write() as conn:
            for s in batch:
                if isinstance(s, Call):
                    _run_call(conn, s)
                    calls.append(s)
                    continue
                if not s.settle:
                    ok = True
                elif s.dead:
                    ok = self._store.message_nack(conn, s.row_id, self._owner, s.deliveries, s.body, now, s.reason)
                else:
                    ok = self._store.message_ack(conn, s.row_id, self._owner, s.deliveries)
                if not ok:
                    lost.append(s)
                for hook in s.hooks:
                    done = _run_hook(conn, hook, s.message_id)
                    if done is not None:
                        after.append(done)
        for call in calls:
            call.done.set()
        for done in after:
            try:
                done()
            except Exception:
                logger.exception("An after-commit ack hook failed.")
        return lost


def _run_call(conn: sqlite3.Connection, call: Call) -> None:
    """Run a caller's write in a SAVEPOINT: if it raises, only its writes roll back and the caller gets
    the exception once the batch committed. A batch retried after the database was unavailable runs it
    again (it was rolled back)."""
    conn.execute("SAVEPOINT ack_call")
    try:
        call.result, call.error = call.fn(conn), None
    except (DatabaseUnavailable, sqlite3.OperationalError):
        raise
    except Exception as e:
        conn.execute("ROLLBACK TO ack_call")
        call.result, call.error = None, e
    conn.execute("RELEASE ack_call")


def _run_hook(conn: sqlite3.Connection, hook: AckHook, message_id: str) -> Callable[[], None] | None:
    """Run one hook in a SAVEPOINT: a hook that raises is rolled back alone and logged; the acks commit.

    A hook whose batch is retried (the database was unavailable) runs again: it was rolled back."""
    conn.execute("SAVEPOINT ack_hook")
    try:
        done = hook(conn)
    except (DatabaseUnavailable, sqlite3.OperationalError):
        raise  # the database, not the hook: the batch is retried (translated to DatabaseUnavailable)
    except Exception:
        conn.execute("ROLLBACK TO ack_hook")
        conn.execute("RELEASE ack_hook")
        logger.exception("The ack hook of message %s failed; its writes were rolled back.", message_id)
        return None
    conn.execute("RELEASE ack_hook")
    return done
