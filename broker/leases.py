"""The per-process lease keeper: heartbeat, reaper and housekeeping in one thread.

Every ``lease_ttl / 3`` it renews the lease of every delivery this process holds (buffered in a
consumer or running in an actor; Dramatiq's TimeLimit allows 10-minute actors) and refreshes the
process row. Every reap interval it returns other owners' expired leases to READY, forgets dead
processes, purges expired dead letters and keeps the WAL bounded.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable

from dramatiq.common import current_millis

from .errors import DatabaseUnavailable
from .store import MessageStore

logger = logging.getLogger(__name__)

#: How often dead processes are forgotten and expired dead letters purged, in seconds.
HOUSEKEEPING_INTERVAL_S = 60.0
#: WAL size above which the keeper runs a TRUNCATE checkpoint, in bytes.
WAL_CHECKPOINT_BYTES = 32 * 1024 * 1024


class LeaseKeeper:
    def __init__(
        self,
        store: MessageStore,
        owner: str,
        lease_ttl_ms: int,
        held_ids: Callable[[], list[int]],
        reap: Callable[[], object],
        housekeeping: Callable[[], None],
        reap_interval_s: float,
    ) -> None:
        self._store = store
        self._owner = owner
        self._ttl = lease_ttl_ms
        self._held_ids = held_ids
        self._reap = reap
        self._housekeeping = housekeeping
        self._reap_interval_s = reap_interval_s
        self.interval_s = lease_ttl_ms / 3000
        self.renewals = 0
        self.failures = 0
        self._next_beat = 0.0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tenure-broker-leases", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=2.0)

    def beat(self) -> None:
        ids = self._held_ids()
        now = current_millis()
        with self._store.write() as conn:
            self._store.lease_extend(conn, self._owner, ids, now, self._ttl)
            self._store.process_heartbeat(conn, self._owner, now)
        self.renewals += len(ids)

    def _run(self) -> None:
        next_reap = time.monotonic() + random.uniform(0, self._reap_interval_s)
        next_housekeeping = time.monotonic() + random.uniform(0, HOUSEKEEPING_INTERVAL_S)
        while not self._stopped.wait(min(self.interval_s, self._reap_interval_s)):
            try:
                now = time.monotonic()
                if now >= self._next_beat:
                    self._next_beat = now + self.interval_s
                    self.beat()
                if now >= next_reap:
                    next_reap = now + self._reap_interval_s * random.uniform(0.8, 1.2)
                    self._reap()
                    self._checkpoint_if_large()
                if now >= next_housekeeping:
                    next_housekeeping = now + HOUSEKEEPING_INTERVAL_S * random.uniform(0.8, 1.2)
                    self._housekeeping()
            except DatabaseUnavailable as e:
                self.failures += 1
                logger.warning("Lease heartbeat failed (%s); retrying.", e)
            except Exception:
                self.failures += 1
                logger.exception("Lease heartbeat crashed; retrying.")

    def _checkpoint_if_large(self) -> None:
        try:
            size = os.path.getsize(self._store.target.path + "-wal")
        except OSError:
            return
        if size > WAL_CHECKPOINT_BYTES:
            busy, log, done = self._store.wal_checkpoint()
            logger.info("WAL checkpoint: %d of %d pages (busy=%d).", done, log, busy)
