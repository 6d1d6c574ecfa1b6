"""Monitoring's own read-only SQL over the SQLite broker's tables.

Everything else the scrape needs comes from the broker's operators' API (``broker.stats()``,
``broker.processes()``); this module holds only what that API does not answer yet. Queries are
read-only, run on the broker's connection for this thread, and use the broker's partial indexes:

- ``broker_messages_leased (lease_expires) WHERE state = 1`` — expired leases are a range of it, so
  the cost is proportional to the number of *expired* leases (normally ~0), not to the table.
"""

from __future__ import annotations

import sqlite3


def lease_expired_by_queue(conn: sqlite3.Connection, now_ms: int) -> dict[str, int]:
    """Leased rows whose lease expired before *now_ms* and were not returned to ready yet, per queue."""
    rows = conn.execute(
        "SELECT queue, count(*) FROM broker_messages INDEXED BY broker_messages_leased "
        "WHERE state = 1 AND lease_expires < ? GROUP BY queue",
        (now_ms,),
    ).fetchall()
    return {queue: int(n) for queue, n in rows}
