"""SQLiteResultBackend: Dramatiq's ``Results`` middleware storing results in the broker's SQLite file.

Results live in ``broker_results`` until their TTL (Dramatiq's ``result_ttl``, milliseconds) passes;
an expired result reads as missing and is deleted by the next purge (at most once per
``purge_interval_ms`` per process, piggybacked on a store). ``get_result(block=True)`` polls the row
with a 2 → 50 ms backoff and is woken at once by a store in the same process.
"""

from __future__ import annotations

import logging

from dramatiq.common import current_millis
from dramatiq.encoder import Encoder
from dramatiq.message import Message
from dramatiq.results import ResultBackend, ResultMissing, ResultTimeout
from dramatiq.results.backend import DEFAULT_TIMEOUT, Missing, MResult, Result

from .connection import DEFAULT_BUSY_TIMEOUT_MS
from .errors import DatabaseUnavailable
from .kv_store import KVStore, target_for
from .sqlite import DEFAULT_URL, SQLiteBroker

logger = logging.getLogger(__name__)

#: Shortest spacing of opportunistic purges of expired results in one process, in milliseconds.
DEFAULT_PURGE_INTERVAL_MS = 60_000


class SQLiteResultBackend(ResultBackend):
    """A Dramatiq result backend on a SQLite file (by default the broker's own).

    Parameters:
      url: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or a plain path.
      broker: A :class:`~broker.SQLiteBroker` whose database to share; when given, ``url``,
        ``synchronous`` and ``busy_timeout_ms`` are ignored and the broker's settings apply.
      namespace: Prefix of result keys, as Dramatiq's other backends.
      encoder: Encodes results; Dramatiq's global encoder (JSON) by default.
      use_namespace_prefix_keys: Store readable ``namespace:queue:actor:message_id`` keys instead
        of their MD5 hashes.
      synchronous: ``"NORMAL"`` or ``"FULL"`` (fsync each stored result).
      busy_timeout_ms: How long a write waits for SQLite's lock before raising.
      purge_interval_ms: Shortest spacing of opportunistic purges of expired results (0: every store).

    Raises:
      UnsupportedDatabase: An in-memory URL, SQLite older than 3.35 or a network filesystem.
      ValueError: An unknown ``synchronous`` mode.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        broker: SQLiteBroker | None = None,
        namespace: str = "dramatiq-results",
        encoder: Encoder | None = None,
        use_namespace_prefix_keys: bool = False,
        synchronous: str = "NORMAL",
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        purge_interval_ms: int = DEFAULT_PURGE_INTERVAL_MS,
    ) -> None:
        super().__init__(namespace=namespace, encoder=encoder, use_namespace_prefix_keys=use_namespace_prefix_keys)
        self.store = KVStore(target_for(url, broker, synchronous, busy_timeout_ms))
        self.purge_interval_ms = purge_interval_ms
        self._next_purge_ms = 0

    def get_result(self, message: Message, *, block: bool = False, timeout: int | None = None) -> Result:
        """Get the result of *message*, optionally waiting for it.

        Parameters:
          message: The message whose result to get.
          block: Wait until the result is stored (or the timeout elapses).
          timeout: How long to wait in milliseconds when blocking; 10 seconds by default.

        Raises:
          ResultMissing: Not blocking and there is no live result.
          ResultTimeout: Blocking and no result was stored in time.
          ResultFailure: The actor failed; its exception was stored instead of a result.
          DatabaseUnavailable: The database is unavailable.

        Returns:
          The actor's return value.
        """
        key = self.build_message_key(message)
        if not block:
            data = self._read(key)
            if data is None:
                raise ResultMissing(message)
        else:
            timeout_ms = DEFAULT_TIMEOUT if timeout is None else timeout
            data = self.store.signals.poll(key, lambda: self._read(key), timeout_ms / 1000)
            if data is None:
                raise ResultTimeout(message)
        return self.unwrap_result(self.encoder.decode(data))

    def purge_expired(self) -> int:
        """Delete expired results now (a batch of up to 1000); the number deleted.

        Raises:
          DatabaseUnavailable: The database is unavailable.
        """
        with self.store.write() as conn:
            return self.store.result_purge_expired(conn, current_millis())

    def close(self) -> None:
        """Close this process's connections to the database (reopened on next use)."""
        self.store.close()

    # -- ResultBackend hooks -----------------------------------------------------------------------
    def _get(self, message_key: str) -> MResult:
        data = self._read(message_key)
        return Missing if data is None else self.encoder.decode(data)

    def _store(self, message_key: str, result: Result, ttl: int) -> None:
        data = self.encoder.encode(result)
        now = current_millis()
        with self.store.write() as conn:
            self.store.result_put(conn, message_key, data, now + int(ttl))
        self.store.signals.notify(message_key)
        if now >= self._next_purge_ms:
            # A separate transaction after the store: the result is visible (and its waiter woken)
            # without waiting for the purge.
            self._next_purge_ms = now + self.purge_interval_ms
            try:
                self.purge_expired()
            except DatabaseUnavailable:
                # Housekeeping must not fail a store that already committed; retried next interval.
                logger.debug("Could not purge expired results.", exc_info=True)

    def _read(self, key: str) -> bytes | None:
        with self.store.read() as conn:
            return self.store.result_get(conn, key, current_millis())

    def __repr__(self) -> str:
        return f"SQLiteResultBackend({self.store.target.path!r}, namespace={self.namespace!r})"


__all__ = ["DEFAULT_PURGE_INTERVAL_MS", "SQLiteResultBackend"]
