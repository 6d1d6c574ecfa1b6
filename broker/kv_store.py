"""All SQL of the results and rate-limiter backends, plus their per-process wake-ups.

Tables (see ``schema.sql``):

- ``broker_results(key, value, expires_at)``: one encoded Dramatiq result per message key;
- ``broker_rate_limits(key, value, expires_at)``: integer counters of the rate limiters (concurrency
  counters, window buckets, barrier party counts) and barrier events (``<barrier>@events`` keys).

Invariants the queries keep:

- ``expires_at`` is wall-clock milliseconds (``dramatiq.common.current_millis``), so every process on
  the host agrees on it; a row is live iff ``expires_at > now``. Expired rows are *missing* to every
  read, and writes treat them as absent, so purging them is only housekeeping, never correctness;
- every read-modify-write runs inside one ``BEGIN IMMEDIATE`` transaction opened by the caller
  (:meth:`KVStore.write`): SQLite then serializes it against every other process's writers.

One static method per query; callers pass the connection so several queries share one transaction.
Connections (per thread, renewed after fork) and the schema come from :class:`~broker.store.MessageStore`.

Waiting for a key (``get_result(block=True)``, ``Barrier.wait``) polls with a short exponential
backoff; :class:`KeySignals` wakes waiters of the same process at once when a writer of that process
commits, so only cross-process hand-offs pay the polling latency (at most :data:`POLL_MAX_S`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

from .connection import SYNCHRONOUS_MODES, SQLiteTarget, parse_sqlite_url
from .errors import DatabaseUnavailable
from .store import MessageStore

if TYPE_CHECKING:
    from .sqlite import SQLiteBroker

T = TypeVar("T")

#: First pause of a waiter polling for a key, in seconds.
POLL_MIN_S = 0.002
#: Longest pause of a waiter polling for a key, in seconds (the worst cross-process wake latency).
POLL_MAX_S = 0.05
#: Most expired rows one purge deletes, so a purge never holds the write lock for long.
PURGE_BATCH_ROWS = 1_000


class KeySignals:
    """In-process wake-ups for keys that somebody is waiting on.

    Only keys with a waiter are tracked (a worker storing millions of results must not grow a dict),
    so a notification for a key nobody waits on costs one dict lookup.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        # key -> [waiters, generation]; the entry lives only while at least one waiter holds it.
        self._keys: dict[str, list[int]] = {}

    def notify(self, key: str) -> None:
        """Wake this process's waiters on *key* (call after the write committed)."""
        with self._cond:
            entry = self._keys.get(key)
            if entry is not None:
                entry[1] += 1
                self._cond.notify_all()

    def poll(self, key: str, probe: Callable[[], T | None], timeout_s: float | None) -> T | None:
        """Call *probe* until it returns a value, backing off from POLL_MIN_S to POLL_MAX_S.

        Parameters:
          key: The key the probe reads; a :meth:`notify` on it re-probes at once.
          probe: Reads the key and returns ``None`` while it is not there.
          timeout_s: How long to wait in seconds; ``None`` waits forever.

        Returns:
          The first value the probe returned, or ``None`` when the timeout elapsed first.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            entry = self._keys.setdefault(key, [0, 0])
            entry[0] += 1
        try:
            delay = POLL_MIN_S
            while True:
                # Read the generation before probing: a commit that lands between the probe and the
                # wait bumps it, so the wait returns at once instead of missing the wake-up.
                with self._cond:
                    seen = entry[1]
                value = probe()
                if value is not None:
                    return value
                pause = delay
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    pause = min(delay, remaining)
                with self._cond:
                    self._cond.wait_for(lambda seen=seen: entry[1] != seen, pause)
                delay = min(delay * 2, POLL_MAX_S)
        finally:
            with self._cond:
                entry[0] -= 1
                if entry[0] == 0:
                    del self._keys[key]


# One KeySignals per database file and process, shared by every backend instance on that file (the
# Results middleware's backend and the one a caller blocks on are often different objects).
_signals: dict[str, KeySignals] = {}
_signals_lock = threading.Lock()


def _signals_for(path: str) -> KeySignals:
    real = os.path.realpath(path)
    with _signals_lock:
        signals = _signals.get(real)
        if signals is None:
            signals = _signals[real] = KeySignals()
        return signals


def _reset_signals_after_fork() -> None:
    # A condition inherited from the parent may be held by a thread that does not exist here.
    global _signals_lock
    _signals_lock = threading.Lock()
    _signals.clear()


os.register_at_fork(after_in_child=_reset_signals_after_fork)


def target_for(url: str, broker: SQLiteBroker | None, synchronous: str, busy_timeout_ms: int) -> SQLiteTarget:
    """The database a backend uses: the broker's when given, else the one *url* names.

    Raises:
      UnsupportedDatabase: *url* names an in-memory database.
      ValueError: An unknown ``synchronous`` mode.
    """
    if broker is not None:
        return broker.target
    mode = synchronous.upper()
    if mode not in SYNCHRONOUS_MODES:
        raise ValueError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
    return SQLiteTarget(parse_sqlite_url(url), mode, busy_timeout_ms)


class KVStore:
    """Per-thread connections to one SQLite file plus the results and rate-limiter queries.

    Parameters:
      target: The database file and its connection settings.

    Raises:
      UnsupportedDatabase: SQLite older than 3.35 or a file on a network filesystem.
    """

    def __init__(self, target: SQLiteTarget) -> None:
        self.target = target
        self._conns = MessageStore(target)
        self._schema_lock = threading.Lock()
        self._schema_pid = -1

    # -- connections and schema --------------------------------------------------------------------
    def _ready(self) -> None:
        """Open this thread's connection; create or check the schema once per process (never in ``__init__``)."""
        self._open()
        if self._schema_pid == os.getpid():
            return
        with self._schema_lock:
            if self._schema_pid != os.getpid():
                self._conns.schema_ensure()
                self._schema_pid = os.getpid()

    def _open(self) -> None:
        # On a brand-new file, ``PRAGMA journal_mode = WAL`` fails with "database is locked" without
        # waiting on the busy timeout while another connection is switching the file to WAL (several
        # processes or threads starting at once). Nothing has happened yet, so retrying is safe.
        deadline = time.monotonic() + self.target.busy_timeout_ms / 1000
        delay = POLL_MIN_S
        while True:
            try:
                self._conns.conn()
                return
            except DatabaseUnavailable:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, POLL_MAX_S)

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` transaction on this thread's connection, committed on success.

        Raises:
          DatabaseUnavailable: The database stayed locked past the busy timeout, or an I/O error.
        """
        self._ready()
        with self._conns.write() as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection for autocommit reads (each statement sees the latest commit).

        Raises:
          DatabaseUnavailable: An I/O error or a lock held past the busy timeout.
        """
        self._ready()
        with self._conns.read() as conn:
            yield conn

    @property
    def signals(self) -> KeySignals:
        """This process's wake-ups for this database file."""
        return _signals_for(self.target.path)

    def close(self) -> None:
        """Close this process's connections (they are reopened on next use)."""
        self._conns.close()

    # -- results -----------------------------------------------------------------------------------
    @staticmethod
    def result_get(conn: sqlite3.Connection, key: str, now: int) -> bytes | None:
        """The encoded result stored under *key*, or ``None`` when missing or expired."""
        row = conn.execute("SELECT value FROM broker_results WHERE key = ? AND expires_at > ?", (key, now)).fetchone()
        return None if row is None else bytes(row[0])

    @staticmethod
    def result_put(conn: sqlite3.Connection, key: str, value: bytes, expires_at: int) -> None:
        """Store (or replace) the result under *key* until *expires_at*."""
        conn.execute(
            "INSERT INTO broker_results (key, value, expires_at) VALUES (?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at",
            (key, value, expires_at),
        )

    @staticmethod
    def result_purge_expired(conn: sqlite3.Connection, now: int, limit: int = PURGE_BATCH_ROWS) -> int:
        """Delete up to *limit* expired results (oldest expiry first); the number deleted."""
        return conn.execute(
            "DELETE FROM broker_results WHERE key IN "
            "(SELECT key FROM broker_results WHERE expires_at <= ? ORDER BY expires_at LIMIT ?)",
            (now, limit),
        ).rowcount

    # -- rate limits -------------------------------------------------------------------------------
    @staticmethod
    def ratelimit_get(conn: sqlite3.Connection, key: str, now: int) -> int | None:
        """The live value of *key*, or ``None`` when missing or expired."""
        row = conn.execute(
            "SELECT value FROM broker_rate_limits WHERE key = ? AND expires_at > ?", (key, now)
        ).fetchone()
        return None if row is None else int(row[0])

    @staticmethod
    def ratelimit_put(conn: sqlite3.Connection, key: str, value: int, expires_at: int) -> None:
        """Set *key* to *value* until *expires_at* (creating it or replacing value and expiry)."""
        conn.execute(
            "INSERT INTO broker_rate_limits (key, value, expires_at) VALUES (?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at",
            (key, value, expires_at),
        )

    @staticmethod
    def ratelimit_add(conn: sqlite3.Connection, key: str, value: int, now: int, expires_at: int) -> bool:
        """Set *key* to *value* unless it holds a live value; True when it was set.

        An expired row counts as absent and is overwritten, as Redis ``SET NX PX`` would.
        """
        return (
            conn.execute(
                "INSERT INTO broker_rate_limits (key, value, expires_at) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at "
                "WHERE broker_rate_limits.expires_at <= ?",
                (key, value, expires_at, now),
            ).rowcount
            == 1
        )

    @staticmethod
    def ratelimit_sum(conn: sqlite3.Connection, keys: Sequence[str], now: int) -> int:
        """The sum of the live values of *keys* (each distinct key counted once; missing ones are 0)."""
        if not keys:
            return 0
        return int(
            conn.execute(
                "SELECT coalesce(sum(value), 0) FROM broker_rate_limits "
                "WHERE key IN (SELECT value FROM json_each(?)) AND expires_at > ?",
                (json.dumps(list(keys)), now),
            ).fetchone()[0]
        )

    @staticmethod
    def ratelimit_purge_expired(conn: sqlite3.Connection, now: int, limit: int = PURGE_BATCH_ROWS) -> int:
        """Delete up to *limit* expired rate-limiter rows (oldest expiry first); the number deleted."""
        return conn.execute(
            "DELETE FROM broker_rate_limits WHERE key IN "
            "(SELECT key FROM broker_rate_limits WHERE expires_at <= ? ORDER BY expires_at LIMIT ?)",
            (now, limit),
        ).rowcount
