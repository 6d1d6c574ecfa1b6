"""Checkpointing the WAL beside the writers, so that no commit on the claim path pays for it.

SQLite's automatic checkpoint runs inside the commit that takes the log past ``wal_autocheckpoint``
pages (1,000 by default): that commit copies the log into the database file and syncs it before it
returns. On a consumer's ack writer, which also commits the claims, it held a claim 4–5 ms about
every 150 messages. A consumer process therefore runs a :class:`WalCheckpointer`: soon after its
ack writer commits, a PASSIVE checkpoint on the checkpointer's own connection copies what the log
holds (PASSIVE never waits for, nor blocks, a reader or a writer), so the log stays below the
automatic threshold. The automatic checkpoint stays on as the fallback when this thread falls
behind, and :class:`broker.leases.LeaseKeeper` still truncates a log that grew large.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

logger = logging.getLogger(__name__)

#: Longest a commit waits before the checkpoint that follows it, in seconds: commits inside this
#: window share one checkpoint (and its syncs).
CHECKPOINT_DELAY_S = 0.05
#: The checkpointer's busy timeout, in milliseconds: PASSIVE only waits for the checkpoint lock,
#: which another process's checkpoint may hold; it tries again after the next commit instead.
CHECKPOINT_BUSY_TIMEOUT_MS = 20


class WalCheckpointer:
    """One thread that checkpoints the database at *path* after :meth:`committed` is called."""

    def __init__(self, path: str, delay_s: float = CHECKPOINT_DELAY_S) -> None:
        self._path = path
        self._delay_s = delay_s
        self._dirty = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tenure-broker-checkpoint", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """Note that a write committed: a checkpoint follows within the delay."""
        self._dirty.set()

    def stop(self) -> None:
        self._stopped.set()
        self._dirty.set()
        self._thread.join(timeout=2.0)

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                self._dirty.wait()
                if self._stopped.wait(self._delay_s):
                    return
                self._dirty.clear()
                try:
                    if conn is None:
                        conn = sqlite3.connect(
                            self._path, timeout=CHECKPOINT_BUSY_TIMEOUT_MS / 1000, isolation_level=None
                        )
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as e:
                    # Busy or unavailable: the next commit brings another try, and the automatic
                    # checkpoint covers the log meanwhile.
                    logger.debug("WAL checkpoint skipped: %s", e)
                    if conn is not None:
                        conn.close()
                        conn = None
        finally:
            if conn is not None:
                conn.close()
