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
#: A hook with a ``batch`` attribute is run together with the other hooks of the same batch function
#: (see :data:`HookBatch`).
AckHook = Callable[[sqlite3.Connection], Callable[[], None] | None]

#: ``batch(conn, hooks)``: the hooks of one ack batch that share this function, run at once (one
#: statement for all of them instead of several each); returns each hook's after-commit callable, in
#: order. If it raises, its writes are rolled back and each hook runs on its own instead.
HookBatch = Callable[[sqlite3.Connection, list[Any]], list[Callable[[], None] | None]]

#: ``batch(conn, fns)``: the functions of the :class:`Call` s of one ack batch that share it, run at
#: once; returns each call's result, in order. If it raises, its writes are rolled back and each
#: call's function runs on its own instead.
CallBatch = Callable[[sqlite3.Connection, list[Any]], list[Any]]


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


class _Done:
    """A one-shot completion flag: a bare lock held until :meth:`set`.

    ``threading.Event`` builds a Condition and a fresh waiter lock per wait; a write that worker
    threads wait for on every message pays for that on each hand-off."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        if not self._set:
            self._set = True
            try:
                self._lock.release()
            except RuntimeError:
                pass  # set twice at once (a shutdown failing it while the writer finishes it): already set

    def is_set(self) -> bool:
        return self._set

    def wait(self) -> None:
        with self._lock:
            pass


class Call:
    """A write another layer runs in the next ack batch and waits for (see ``SQLiteBroker.write_with_acks``).

    ``batch``: calls of one ack batch sharing this function run together (see :data:`CallBatch`)."""

    __slots__ = ("fn", "done", "result", "error", "batch")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any], batch: CallBatch | None = None) -> None:
        self.fn = fn
        self.batch = batch
        self.done = _Done()
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

    @property
    def running(self) -> bool:
        """Whether writes submitted now will be run (the writer is neither stopped nor dead)."""
        return not self._stopped and self._thread.is_alive()

    def run(self, fn: Callable[[sqlite3.Connection], Any], batch: CallBatch | None = None) -> Any:
        """Run ``fn(conn)`` in the next batch and wait for its commit; returns its result (see :class:`Call`).

        Raises:
          DatabaseUnavailable: The writer stopped before running it.
        """
        call = Call(fn, batch)
        self.submit(call)
        return call.wait()

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
            with self._cond:
                for item in self._pending:
                    if isinstance(item, Call) and not item.done.is_set():
                        # Nobody will run it: its caller must not wait forever.
                        item.error = DatabaseUnavailable("the broker's ack writer has stopped")
                        item.done.set()
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
        after: list[Callable[[], None] | None] = []
        calls: list[Call] = []
        call_groups: dict[CallBatch, list[Call]] = {}
        hook_groups: dict[HookBatch, list[tuple[AckHook, str]]] = {}
        now = current_millis()
        with self._store.write() as conn:
            acked = self._store.message_ack_many(
                conn,
                self._owner,
                [(s.row_id, s.deliveries) for s in batch if not isinstance(s, Call) and s.settle and not s.dead],
            )
            for s in batch:
                if isinstance(s, Call):
                    calls.append(s)
                    if s.batch is not None:
                        call_groups.setdefault(s.batch, []).append(s)
                    else:
                        _run_call(conn, s)
                    continue
                if not s.settle:
                    ok = True
                elif s.dead:
                    ok = self._store.message_nack(conn, s.row_id, self._owner, s.deliveries, s.body, now, s.reason)
                else:
                    ok = s.row_id in acked
                    acked.discard(s.row_id)  # one settlement per delivery: a repeat finds it gone, as it would
                if not ok:
                    lost.append(s)
                for hook in s.hooks:
                    grouped: HookBatch | None = getattr(hook, "batch", None)
                    if grouped is not None:
                        hook_groups.setdefault(grouped, []).append((hook, s.message_id))
                    else:
                        after.append(_run_hook(conn, hook, s.message_id))
            for call_batch, members in call_groups.items():
                _run_call_batch(conn, call_batch, members)
            for hook_batch, hooks in hook_groups.items():
                after.extend(_run_hook_batch(conn, hook_batch, hooks))
        for call in calls:
            call.done.set()
        for done in after:
            if done is None:
                continue
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


def _run_batch(conn: sqlite3.Connection, run: Callable[[], list[Any]], size: int, what: str) -> list[Any] | None:
    """Run a batch function in a SAVEPOINT; None (its writes rolled back, logged) if it raised."""
    conn.execute("SAVEPOINT ack_batch")
    try:
        results = run()
        if len(results) != size:
            raise RuntimeError(f"a batched ack write returned {len(results)} results for {size} {what}")
    except (DatabaseUnavailable, sqlite3.OperationalError):
        raise
    except Exception:
        conn.execute("ROLLBACK TO ack_batch")
        conn.execute("RELEASE ack_batch")
        logger.exception("A batched write of %d %s failed; running them one by one.", size, what)
        return None
    conn.execute("RELEASE ack_batch")
    return results


def _run_call_batch(conn: sqlite3.Connection, batch: CallBatch, calls: list[Call]) -> None:
    results = _run_batch(conn, lambda: batch(conn, [c.fn for c in calls]), len(calls), "calls")
    if results is None:
        for call in calls:
            _run_call(conn, call)
        return
    for call, result in zip(calls, results, strict=True):
        call.result, call.error = result, None


def _run_hook_batch(
    conn: sqlite3.Connection, batch: HookBatch, hooks: list[tuple[AckHook, str]]
) -> list[Callable[[], None] | None]:
    results = _run_batch(conn, lambda: batch(conn, [h for h, _ in hooks]), len(hooks), "ack hooks")
    if results is None:
        return [_run_hook(conn, hook, message_id) for hook, message_id in hooks]
    return results
