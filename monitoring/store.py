"""Monitoring's own read-only SQL over the SQLite broker's tables (and the write gate's shared state).

Everything else the scrape needs comes from the broker's operators' API (``broker.stats()``,
``broker.processes()``); this module holds only what that API does not answer yet. Queries are
read-only, run on the broker's connection for this thread, and use the broker's partial indexes:

- ``broker_messages_leased (lease_expires) WHERE state = 1`` — expired leases are a range of it, so
  the cost is proportional to the number of *expired* leases (normally ~0), not to the table.

:func:`degraded_output_roots` reads ``output_root_health`` (the actors' write gate, shared by every
worker through the job database) for readiness health; monitoring cannot import the actors' layer, so
it reads the table by name.
"""

from __future__ import annotations

import sqlite3

from sqlalchemy import Engine, text

from jobs.db import read


def lease_expired_by_queue(conn: sqlite3.Connection, now_ms: int) -> dict[str, int]:
    """Leased rows whose lease expired before *now_ms* and were not returned to ready yet, per queue."""
    rows = conn.execute(
        "SELECT queue, count(*) FROM broker_messages INDEXED BY broker_messages_leased "
        "WHERE state = 1 AND lease_expires < ? GROUP BY queue",
        (now_ms,),
    ).fetchall()
    return {queue: int(n) for queue, n in rows}


def degraded_output_roots(engine: Engine) -> dict[str, str]:
    """Every output root the write gate holds degraded, with its cached error (``output_root_health``)."""
    with read(engine) as conn:
        rows = conn.execute(
            text("SELECT root, error FROM output_root_health WHERE state = 'degraded' ORDER BY root")
        ).fetchall()
    return {root: error or "" for root, error in rows}
