"""SQLiteRateLimiterBackend: Dramatiq's rate limiters, ``Barrier`` and ``GroupCallbacks`` on SQLite.

Every key is an integer row of ``broker_rate_limits`` with an expiry in wall-clock milliseconds, as
a Redis key with ``PX``. Each operation runs in one ``BEGIN IMMEDIATE`` transaction, so counters
stay exact across threads and processes on the host (SQLite serializes the writers). Successful
writes reset the key's TTL, as Dramatiq's Redis backend does; failed ones leave it untouched.

``wait``/``wait_notify`` follow the Redis backend, not the stub: a notification is a row that stays
until its TTL, so a party that starts waiting after the barrier cleared still sees it. Waiters poll
with a 2 → 50 ms backoff and are woken at once by a notification from their own process.

Limits: expired rows (window buckets pile up one per second per key) are deleted in batches at most
once per ``purge_interval_ms`` per process; until then they only take space.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from dramatiq.common import current_millis
from dramatiq.rate_limits import RateLimiterBackend

from .connection import DEFAULT_BUSY_TIMEOUT_MS
from .errors import DatabaseUnavailable
from .kv_store import KVStore, target_for
from .sqlite import DEFAULT_URL, SQLiteBroker

logger = logging.getLogger(__name__)

#: Shortest spacing of opportunistic purges of expired keys in one process, in milliseconds.
DEFAULT_PURGE_INTERVAL_MS = 60_000


class SQLiteRateLimiterBackend(RateLimiterBackend):
    """A Dramatiq rate-limiter backend on a SQLite file (by default the broker's own).

    Parameters:
      url: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or a plain path.
      broker: A :class:`~broker.SQLiteBroker` whose database to share; when given, ``url``,
        ``synchronous`` and ``busy_timeout_ms`` are ignored and the broker's settings apply.
      synchronous: ``"NORMAL"`` or ``"FULL"``.
      busy_timeout_ms: How long an operation waits for SQLite's lock before raising.
      purge_interval_ms: Shortest spacing of opportunistic purges of expired keys (0: every write).

    Raises:
      UnsupportedDatabase: An in-memory URL, SQLite older than 3.35 or a network filesystem.
      ValueError: An unknown ``synchronous`` mode.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        broker: SQLiteBroker | None = None,
        synchronous: str = "NORMAL",
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        purge_interval_ms: int = DEFAULT_PURGE_INTERVAL_MS,
    ) -> None:
        self.store = KVStore(target_for(url, broker, synchronous, busy_timeout_ms))
        self.purge_interval_ms = purge_interval_ms
        self._next_purge_ms = 0

    def add(self, key: str, value: int, ttl: int) -> bool:
        """Set *key* to *value* for *ttl* ms unless it already holds a live value.

        Returns:
          True when the key was set.

        Raises:
          DatabaseUnavailable: The database is unavailable.
        """
        with self.store.write() as conn:
            now = current_millis()
            added = self.store.ratelimit_add(conn, key, value, now, now + int(ttl))
        self._purge_if_due(now)
        return added

    def incr(self, key: str, amount: int, maximum: int, ttl: int) -> bool:
        """Add *amount* to *key* (missing counts as 0) unless the result would exceed *maximum*.

        Returns:
          True when the key was incremented (its TTL is then reset to *ttl* ms).

        Raises:
          DatabaseUnavailable: The database is unavailable.
        """
        return self._change(key, amount, lambda value: value <= maximum, ttl)

    def decr(self, key: str, amount: int, minimum: int, ttl: int) -> bool:
        """Subtract *amount* from *key* (missing counts as 0) unless the result would drop below *minimum*.

        Returns:
          True when the key was decremented (its TTL is then reset to *ttl* ms).

        Raises:
          DatabaseUnavailable: The database is unavailable.
        """
        return self._change(key, -amount, lambda value: value >= minimum, ttl)

    def incr_and_sum(self, key: str, keys: Callable[[], Iterable[str]], amount: int, maximum: int, ttl: int) -> bool:
        """Add *amount* to *key* unless it, or *amount* plus the sum over ``keys()``, would exceed *maximum*.

        This is the sliding window of :class:`dramatiq.rate_limits.WindowRateLimiter`: *key* is the
        current second's bucket and ``keys()`` lists the buckets of the whole window.

        Returns:
          True when the key was incremented (its TTL is then reset to *ttl* ms).

        Raises:
          DatabaseUnavailable: The database is unavailable.
        """
        with self.store.write() as conn:
            now = current_millis()
            value = (self.store.ratelimit_get(conn, key, now) or 0) + amount
            if value > maximum:
                return False
            # keys() is evaluated under the write lock, so the window is the one current when no
            # other process can add to it (the Redis backend re-fetches keys for the same reason).
            if amount + self.store.ratelimit_sum(conn, list(keys()), now) > maximum:
                return False
            self.store.ratelimit_put(conn, key, value, now + int(ttl))
        self._purge_if_due(now)
        return True

    def wait(self, key: str, timeout: int | None) -> bool:
        """Wait until :meth:`wait_notify` was called on *key* (before or during the wait).

        Parameters:
          key: The event key.
          timeout: How long to wait in milliseconds; ``None`` waits forever.

        Returns:
          True when the event happened, False when the timeout elapsed first.

        Raises:
          DatabaseUnavailable: The database is unavailable.
        """
        timeout_s = None if timeout is None else timeout / 1000
        return self.store.signals.poll(key, lambda: self._has_event(key), timeout_s) is not None

    def wait_notify(self, key: str, ttl: int) -> None:
        """Wake every party waiting on *key*, now and for the next *ttl* ms.

        Raises:
          DatabaseUnavailable: The database is unavailable.
        """
        with self.store.write() as conn:
            now = current_millis()
            self.store.ratelimit_put(conn, key, 1, now + int(ttl))
        self.store.signals.notify(key)
        self._purge_if_due(now)

    def purge_expired(self) -> int:
        """Delete expired keys now (a batch of up to 1000); the number deleted.

        Raises:
          DatabaseUnavailable: The database is unavailable.
        """
        with self.store.write() as conn:
            return self.store.ratelimit_purge_expired(conn, current_millis())

    def close(self) -> None:
        """Close this process's connections to the database (reopened on next use)."""
        self.store.close()

    # -- internals ---------------------------------------------------------------------------------
    def _change(self, key: str, delta: int, within: Callable[[int], bool], ttl: int) -> bool:
        with self.store.write() as conn:
            # The clock is read under the write lock so the TTL counts from the write itself.
            now = current_millis()
            value = (self.store.ratelimit_get(conn, key, now) or 0) + delta
            if not within(value):
                return False
            self.store.ratelimit_put(conn, key, value, now + int(ttl))
        self._purge_if_due(now)
        return True

    def _has_event(self, key: str) -> bool | None:
        with self.store.read() as conn:
            return True if self.store.ratelimit_get(conn, key, current_millis()) is not None else None

    def _purge_if_due(self, now: int) -> None:
        if now >= self._next_purge_ms:
            # A separate, later transaction: the operation that triggered it has already committed.
            self._next_purge_ms = now + self.purge_interval_ms
            try:
                self.purge_expired()
            except DatabaseUnavailable:
                # Housekeeping must not fail an operation that already committed; retried next interval.
                logger.debug("Could not purge expired rate-limiter keys.", exc_info=True)

    def __repr__(self) -> str:
        return f"SQLiteRateLimiterBackend({self.store.target.path!r})"


__all__ = ["DEFAULT_PURGE_INTERVAL_MS", "SQLiteRateLimiterBackend"]
