"""Group commit of the job layer's hot-path writes: claim, progress, events, completion.

Every job makes at least three small write transactions (claim, progress, completion). On SQLite each
commit appends the pages it touched to the WAL (the ``jobs`` row's page and its index pages, the
event page and its index pages), so three commits per job cost far more than the statements
themselves, and all of them queue on the file's single write lock. On PostgreSQL each commit is a
round trip and a WAL flush the committing thread waits for. Here the threads of one process hand
those writes to one writer thread, which runs everything that arrived meanwhile in ONE transaction
(SQLite: ``BEGIN IMMEDIATE … COMMIT`` on a raw connection, the way the broker group-commits its acks;
PostgreSQL: one connection of the engine), so a page shared by many jobs is written, and a commit
waited for, once per batch instead of once per job. The claims of a batch, and its successes, run
together (:class:`Together`): one statement for all of them rather than one per job, which is what a
PostgreSQL writer's time goes to (one round trip per statement).

Each write still has all-or-nothing semantics of its own: when one raises, the batch is rolled back
and replayed write by write, each in its own transaction, so only that write fails and its
exception goes to its caller. A caller returns only after the
batch holding its write has committed (or failed: then every caller of the batch gets the error and
its own retry policy applies), and its after-commit work runs after that commit — exactly what
:func:`jobs.db.write` promises, so callers cannot tell the difference except by speed.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine

from . import tracing
from .db import Tx, busy_timeout_ms, fast_sqlite, raw_connection, write, writer_lock
from .lifecycle import AfterCommitBuffer

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Most writes committed in one transaction (bounds how long one batch holds the write lock).
MAX_BATCH = 256
#: A writer thread idle this long exits and closes its connection (a test run touches many files).
IDLE_EXIT_S = 10.0


class _WriteFailed(Exception):
    """A write of the batch raised (its exception is on the write); the batch was rolled back."""


@dataclass(frozen=True, slots=True)
class Together:
    """How a write runs with the others of its kind in the same batch: ``run(txs, items)`` does what each
    write's own function would do for its *item*, in one call (a claim or a success of several jobs in one
    statement), and returns their results in order. Writes are grouped by *run*."""

    run: Callable[[list[Tx], list[Any]], list[Any]]
    item: Any


class _Write:
    __slots__ = ("fn", "together", "done", "result", "error", "pending", "committed", "trace")

    def __init__(self, fn: Callable[[Tx], Any], together: Together | None = None) -> None:
        self.fn = fn
        self.together = together
        #: The caller's trace context: the write's statements are its spans' children, whatever thread runs them.
        self.trace = tracing.current_context()
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.pending = AfterCommitBuffer()
        self.committed = False


class _SqliteFile:
    """How the writer of one SQLite file connects and runs a batch: a raw connection, ``BEGIN IMMEDIATE``."""

    def __init__(self, path: str, busy_timeout_ms: int) -> None:
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms

    def connect(self) -> sqlite3.Connection:
        return raw_connection(self.path, self.busy_timeout_ms)

    @staticmethod
    def transaction(conn: sqlite3.Connection, batch: list[_Write]) -> None:
        # No SAVEPOINT per write: two more statements per write, each a GIL round trip in this busy
        # thread. A write that raises rolls the batch back and _commit replays it write by write.
        conn.execute("BEGIN IMMEDIATE")
        try:
            _run(conn, batch)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @staticmethod
    def close(conn: sqlite3.Connection) -> None:
        conn.close()


class _Engine:
    """How the writer of a server database connects and runs a batch: one connection of the engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def connect(self) -> Connection:
        return self.engine.connect()

    @staticmethod
    def transaction(conn: Connection, batch: list[_Write]) -> None:
        with conn.begin():
            _run(conn, batch)

    @staticmethod
    def close(conn: Connection) -> None:
        conn.close()


def _run(conn: Any, batch: list[_Write]) -> None:
    groups: dict[Callable[..., list[Any]], list[_Write]] = {}
    for w in batch:
        if w.together is None:
            _run_alone(conn, w)
        else:
            groups.setdefault(w.together.run, []).append(w)
    for run, writes in groups.items():
        if len(writes) == 1:
            _run_alone(conn, writes[0])
            continue
        try:
            with tracing.within(writes[0].trace):  # one statement for all: its span goes to the first's trace
                results = run([Tx(conn, w.pending) for w in writes], [w.together.item for w in writes])  # type: ignore[union-attr]
        except Exception as e:
            # _commit runs each write of the batch alone next, so the one that raised gets its error.
            raise _WriteFailed() from e
        for w, result in zip(writes, results, strict=True):
            w.result = result


def _run_alone(conn: Any, w: _Write) -> None:
    try:
        with tracing.within(w.trace):
            w.result = w.fn(Tx(conn, w.pending))
    except Exception as e:
        w.error = e
        raise _WriteFailed() from e


class GroupCommitter:
    """The writer thread of one database in this process."""

    def __init__(self, key: str, database: _SqliteFile | _Engine, lock: Any) -> None:
        self._key = (os.getpid(), key)
        self._database = database
        self._lock = lock
        self._pending: deque[_Write] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._conn: Any = None
        self._retired = False
        self._thread = threading.Thread(target=self._run, name="tenure-job-writes", daemon=True)
        self._thread.start()

    def submit(self, write: _Write) -> bool:
        """Queue *write* for the next batch; False if this writer has retired (get a new one)."""
        with self._cond:
            if self._retired:
                return False
            self._pending.append(write)
            self._cond.notify()
            return True

    def wait(self, write: _Write) -> Any:
        write.done.wait()
        if write.error is not None:
            raise write.error
        write.pending.run()
        return write.result

    # -- the writer thread --------------------------------------------------------------------------
    def _connect(self) -> Any:
        if self._conn is None:
            self._conn = self._database.connect()
        return self._conn

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._pending:
                    self._cond.wait(IDLE_EXIT_S)
                if not self._pending:
                    self._retired = True
                    break
                batch = [self._pending.popleft() for _ in range(min(len(self._pending), MAX_BATCH))]
            try:
                self._commit(batch)
            except BaseException as e:  # the batch did not commit: every caller gets the error
                for write in batch:
                    if write.error is None and not write.committed:
                        write.error = e
                        write.pending = AfterCommitBuffer()
                self._reset()
            for write in batch:
                write.done.set()
        with _committers_lock:
            if _committers.get(self._key) is self:
                del _committers[self._key]
        self._reset()

    def _commit(self, batch: list[_Write]) -> None:
        conn = self._connect()
        with self._lock:
            try:
                self._transaction(conn, batch)
                return
            except _WriteFailed:
                pass
            # One write raised (rare: a constraint, a bug): its batch was rolled back; run each write
            # in a transaction of its own so only that write fails.
            for write in batch:
                write.error, write.pending = None, AfterCommitBuffer()
                try:
                    self._transaction(conn, [write])
                except _WriteFailed:
                    pass

    def _transaction(self, conn: Any, batch: list[_Write]) -> None:
        self._database.transaction(conn, batch)
        for w in batch:
            w.committed = True

    def _reset(self) -> None:
        # After a failed batch (database unavailable, disk full…) start over with a fresh connection.
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                self._database.close(conn)
            except Exception:
                logger.debug("Closing the job writer's connection failed.", exc_info=True)


_committers: dict[tuple[int, str], GroupCommitter] = {}
_committers_lock = threading.Lock()


def _committer(engine: Engine) -> GroupCommitter:
    """The writer thread of *engine*'s database in this process (started on first use)."""
    sqlite = engine.dialect.name == "sqlite"
    name = engine.url.database if sqlite else engine.url.render_as_string(hide_password=True)
    assert name
    key = (os.getpid(), name)
    c = _committers.get(key)
    if c is None:
        with _committers_lock:
            c = _committers.get(key)
            if c is None:
                database = _SqliteFile(name, busy_timeout_ms(engine)) if sqlite else _Engine(engine)
                c = _committers[key] = GroupCommitter(name, database, writer_lock(engine))
    return c


def hot_write(engine: Engine, fn: Callable[[Tx], T], together: Together | None = None) -> T:
    """Run ``fn(tx)`` in a write transaction and return its result after the commit.

    The write is group-committed with the other hot-path writes of this process; *together*, when given,
    runs it in one call with the writes of its kind in the same batch (``fn`` still runs it alone when
    it is the only one, and when a batch is replayed write by write). On SQLite (engines made
    by :func:`jobs.db.make_engine`) ``tx.conn`` is a raw :class:`sqlite3.Connection` (the store's
    hot-path queries accept either); on PostgreSQL, a connection of the engine's pool. *fn* must not
    keep state across calls, since a batch that fails as a whole is reported to every caller, whose
    retry runs *fn* again. A SQLite engine made otherwise (``_unserialized``) writes inline:
    ``with jobs.db.write(engine) as tx: return fn(tx)``.
    """
    postgres = engine.dialect.name == "postgresql"
    if not (postgres or fast_sqlite(engine)) or writer_lock(engine).owned():
        # (A thread already inside a write transaction of this file would wait for the writer thread
        # while holding the lock that thread needs: it runs its write inline instead, as before.)
        with write(engine) as tx:
            return fn(tx)
    w = _Write(fn, together)
    while True:
        c = _committer(engine)
        if c.submit(w):
            return c.wait(w)  # type: ignore[no-any-return]
