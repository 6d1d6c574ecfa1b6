"""SQLAlchemy engines for job records, and the two kinds of transaction the job layer uses.

SQLite: every connection uses WAL, a busy timeout and foreign keys, and pysqlite's own transaction
handling is switched off (``isolation_level=None``) so that :func:`write` opens its transaction
with ``BEGIN IMMEDIATE``: the write lock is taken before the first read, so a transaction that
reads a job and then updates it can never fail half-way with SQLITE_BUSY, and two such
transactions (cancel vs result commit) are strictly ordered. :func:`read` opens a plain deferred
``BEGIN`` and never blocks writers.

PostgreSQL (psycopg 3): READ COMMITTED; the store takes row locks with ``SELECT … FOR UPDATE``
where a decision depends on a row that a concurrent transaction might change.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy
from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from broker.writer_queue import process_write_lock
from settings.environment import DEFAULT_SQLITE_BUSY_TIMEOUT_MS

from . import sqlite_aggregates
from .lifecycle import AfterCommit, AfterCommitBuffer, SessionAfterCommit

#: Execution option that marks a connection's transactions read-only (deferred ``BEGIN`` on SQLite).
READONLY = "tenure_readonly"


def normalize_url(url: str) -> str:
    """``postgres://``/``postgresql://`` → ``postgresql+psycopg://`` (psycopg 3); others unchanged."""
    u = make_url(url)
    if u.drivername in ("postgres", "postgresql"):
        u = u.set(drivername="postgresql+psycopg")
    return u.render_as_string(hide_password=False)


def sqlite_path(url: str) -> str | None:
    """The file of a ``sqlite:///…`` URL (None for other databases)."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite":
        return None
    return u.database or None


def make_engine(
    url: str,
    *,
    busy_timeout_ms: int = DEFAULT_SQLITE_BUSY_TIMEOUT_MS,
    serialize_writers: bool = True,
    **kwargs: Any,
) -> Engine:
    """Create an engine configured for the job layer.

    Parameters:
      url: ``sqlite:///path.db`` or ``postgresql://…``.
      busy_timeout_ms: SQLite only: how long to wait for the write lock.
      serialize_writers: SQLite only: queue this process's write transactions on a Python lock
        (see :func:`writer_lock`); False makes the engine contend in SQLite like another process.
      kwargs: Passed to :func:`sqlalchemy.create_engine`.

    Raises:
      ValueError: An in-memory SQLite database (other processes could not see it).

    Returns:
      The engine. Its pool is process-local: after ``fork`` call ``engine.dispose(close=False)``.
    """
    url = normalize_url(url)
    u = make_url(url)
    # ``sqlalchemy.create_engine`` is looked up at each call: OpenTelemetry's SQLAlchemy instrumentation
    # (``monitoring.tracing``) wraps that module attribute, which a name imported earlier would bypass.
    create_engine = sqlalchemy.create_engine
    if u.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, **kwargs)
    if not u.database or u.database == ":memory:":
        raise ValueError("Tenure needs a SQLite file shared by its processes, not an in-memory database")
    os.makedirs(os.path.dirname(os.path.abspath(u.database)), exist_ok=True)
    connect_args = {"timeout": busy_timeout_ms / 1000, "check_same_thread": False}
    connect_args.update(kwargs.pop("connect_args", {}))
    engine = create_engine(url, connect_args=connect_args, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite would otherwise BEGIN (deferred) lazily before DML and never before SELECT.
        dbapi_connection.isolation_level = None
        cur = dbapi_connection.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()
        sqlite_aggregates.register(dbapi_connection)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(READONLY) else "BEGIN IMMEDIATE")

    if not serialize_writers:
        _unserialized.add(engine)
    return engine


def is_sqlite(bind: Engine | Connection) -> bool:
    return bind.dialect.name == "sqlite"


class _NoLock:
    """A lock that never blocks (databases with row locks need no per-process writer queue)."""

    def acquire(self) -> bool:
        return True

    def owned(self) -> bool:
        return False

    def release(self) -> None:
        pass

    def __enter__(self) -> _NoLock:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


_NO_LOCK = _NoLock()
_unserialized: weakref.WeakSet[Engine] = weakref.WeakSet()


def writer_lock(engine: Engine) -> Any:
    """This process's place in the queue for one SQLite file's write lock (:mod:`broker.writer_queue`).

    SQLite has one writer; writers that all try ``BEGIN IMMEDIATE`` at once wait in SQLite's busy
    handler, which sleeps in growing steps (milliseconds). Queueing them first (the threads of a
    process on a Python lock, the processes on a lock file) hands the write lock over at once.
    For other databases this is a no-op context manager.
    """
    path = engine.url.database if engine.dialect.name == "sqlite" else None
    if not path or path == ":memory:" or engine in _unserialized:
        return _NO_LOCK
    # The broker's own lock for this file: job and broker writes of one process (claims, acks,
    # job transitions) then hand SQLite's write lock over without its sleeping busy handler.
    return process_write_lock(path)


@contextmanager
def write(engine: Engine) -> Iterator[Tx]:
    """A write transaction (``BEGIN IMMEDIATE`` on SQLite), committed when the block exits cleanly.

    Work queued with :meth:`Tx.after_commit` runs after the commit and is dropped on rollback.
    """
    with writer_lock(engine), engine.connect() as conn:
        tx = Tx(conn, AfterCommitBuffer())
        with conn.begin():
            yield tx
    tx.pending.run()


@contextmanager
def write_session(engine: Engine) -> Iterator[Session]:
    """A write transaction as a Session, for a caller that joins several writes into one commit.

    Services that take ``target: Engine | Session`` (``submit``, ``cancel``, ``retry``, ``run_now``,
    ``delete_job``, the scheduler's operator calls) write into it instead of committing on their own;
    the caller adds its own rows (an audit record) on ``session.connection()``. Commits when the block
    exits cleanly (after-commit work then runs), rolls everything back when it raises.
    """
    with writer_lock(engine), Session(engine) as session, session.begin():
        yield session


@contextmanager
def transaction(target: Engine | Session) -> Iterator[Tx]:
    """A write transaction of its own (an Engine: :func:`write`), or the caller's Session's (nothing is
    committed here; after-commit work waits for the Session's commit)."""
    if isinstance(target, Session):
        yield session_tx(target)
        return
    with write(target) as tx:
        yield tx


def engine_of(target: Engine | Session) -> Engine:
    """The engine of *target* (for the reads a service makes outside its write transaction)."""
    if isinstance(target, Session):
        bind = target.get_bind()
        return bind if isinstance(bind, Engine) else bind.engine
    return target


@contextmanager
def read(engine: Engine) -> Iterator[Connection]:
    """A read-only transaction (deferred ``BEGIN`` on SQLite: it never waits for the writer)."""
    with engine.connect() as conn:
        conn = conn.execution_options(**{READONLY: True})
        with conn.begin():
            yield conn


@contextmanager
def autocommit(engine: Engine) -> Iterator[Connection]:
    """A connection for a single read whose answer decides whether a write transaction is worth opening.

    On a server database every statement is a transaction of its own, with no ``BEGIN`` or ``COMMIT`` round
    trips. On SQLite (in the process: there are no round trips to save) it is a :func:`read`, which takes
    no lock; autocommit there would meet this module's ``BEGIN`` hook, which would open a write transaction
    that nothing commits."""
    if is_sqlite(engine):
        with read(engine) as conn:
            yield conn
        return
    with engine.connect() as conn:
        yield conn.execution_options(isolation_level="AUTOCOMMIT")


class _ThreadConnections(threading.local):
    """This thread's raw sqlite3 connections, by database path (see :func:`fast_read`)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.by_path: dict[str, sqlite3.Connection] = {}


_threads = _ThreadConnections()
#: Raw connections kept open per thread (one per database file it writes jobs to).
_MAX_THREAD_CONNECTIONS = 4


def _thread_connection(engine: Engine) -> sqlite3.Connection:
    state = _threads
    if state.pid != os.getpid():  # forked: the parent's connections are not ours to use
        state.pid, state.by_path = os.getpid(), {}
    path = engine.url.database
    assert path
    conn = state.by_path.get(path)
    if conn is None:
        conn = raw_connection(path, busy_timeout_ms(engine))
        if len(state.by_path) >= _MAX_THREAD_CONNECTIONS:
            # A process (a test run) that touched many files: keep only recent ones open. Closed
            # here, by the thread that owns them.
            oldest = next(iter(state.by_path))
            state.by_path.pop(oldest).close()
        state.by_path[path] = conn
    return conn


def busy_timeout_ms(engine: Engine) -> int:
    """The busy timeout *engine*'s SQLite connections were configured with."""
    with engine.connect() as probe:
        return int(probe.exec_driver_sql("PRAGMA busy_timeout").scalar() or DEFAULT_SQLITE_BUSY_TIMEOUT_MS)


def raw_connection(path: str, busy_ms: int) -> sqlite3.Connection:
    """A plain sqlite3 connection with the settings of :func:`make_engine`'s connections."""
    conn = sqlite3.connect(path, timeout=busy_ms / 1000, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def fast_sqlite(engine: Engine) -> bool:
    """Whether the hot path (:mod:`jobs.group_commit`, :func:`fast_read`) bypasses SQLAlchemy for *engine*."""
    return engine.dialect.name == "sqlite" and engine not in _unserialized


@contextmanager
def fast_read(engine: Engine) -> Iterator[Any]:
    """A read on this thread's raw sqlite3 connection (autocommit: its own snapshot); :func:`read` elsewhere.

    For the checkpoints actors call often (``check_cancelled``): SQLAlchemy's pool checkout and
    transaction events cost several times the one-row SELECT."""
    if not fast_sqlite(engine):
        with read(engine) as conn:
            yield conn
        return
    yield _thread_connection(engine)


class Tx:
    """An open transaction: its connection and the work to run once it commits."""

    __slots__ = ("conn", "pending", "_session", "broker")

    def __init__(self, conn: Connection, pending: Any, session: Session | None = None) -> None:
        self.conn = conn
        #: An :class:`~jobs.lifecycle.AfterCommitBuffer` (or a Session's): what runs after the commit.
        self.pending = pending
        self._session = session
        #: The broker for messages this transaction may have to write (workflow steps becoming ready).
        self.broker: Any = None

    def after_commit(self, fn: AfterCommit) -> None:
        """Run *fn* once this transaction has committed (never if it rolls back)."""
        self.pending.add(fn)

    def savepoint(self) -> Any:
        """A nested transaction (SAVEPOINT) as a context manager: rolled back if the block raises."""
        if self._session is not None:
            return self._session.begin_nested()
        return self.conn.begin_nested()


def session_tx(session: Session) -> Tx:
    """A :class:`Tx` inside a caller's Session: nothing is committed here; after-commit work waits for its commit."""
    return Tx(session.connection(), SessionAfterCommit(session), session)
