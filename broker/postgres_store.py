"""All SQL of the PostgreSQL broker (:class:`broker.postgres.PostgresBroker`).

The tables (``postgres_schema.sql``) mirror the SQLite broker's ``broker_messages`` states. The invariants
are the same: a LEASED row has an owner and an expiry; every write made on behalf of a delivery is fenced
by ``(id, lease_owner, deliveries)``, so a stale ack, nack or requeue of a row that was reclaimed and leased
again touches nothing. Claims take READY rows in (priority, eta, id) order with ``FOR UPDATE SKIP LOCKED``.

One function per query; callers pass the psycopg connection (or cursor) so that several queries, or a
caller's own rows, share one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

from .store import ClaimedRow, QueueStats, message_state, message_values

#: Version of ``postgres_schema.sql``; a database recording a newer one is refused.
SCHEMA_VERSION = 1
#: Advisory lock key taken while the schema is created, so that processes starting together do not race
#: on ``CREATE … IF NOT EXISTS`` (which is not atomic in PostgreSQL's catalogs).
SCHEMA_LOCK_KEY = 0x7465_6E75_7265_0001
#: Channel of the wake-up notifications (the payload is the queue name).
CHANNEL = "tenure_pgbroker"


def schema_sql() -> str:
    """The broker's DDL, as shipped in ``broker/postgres_schema.sql``."""
    return resources.files(__package__).joinpath("postgres_schema.sql").read_text(encoding="utf-8")


def schema_version(conn: Any) -> int | None:
    """The recorded schema version, or None when the broker's tables do not exist yet."""
    if conn.execute("SELECT to_regclass('pgbroker_meta')").fetchone()[0] is None:
        return None
    row = conn.execute("SELECT value FROM pgbroker_meta WHERE key = 'schema_version'").fetchone()
    return None if row is None else int(row[0])


def schema_create(conn: Any) -> None:
    """Create the tables inside the caller's transaction, under the schema lock."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK_KEY,))
    conn.execute(schema_sql())


def message_insert(
    conn: Any,
    *,
    queue: str,
    message_id: str,
    actor: str,
    priority: int,
    eta: int,
    enqueued_at: int,
    body: bytes,
) -> None:
    conn.execute(
        "INSERT INTO pgbroker_messages (queue, message_id, actor, priority, eta, state, enqueued_at, body) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
        (queue, message_id, actor, priority, eta, message_state(eta, enqueued_at), enqueued_at, body),
    )


#: Rows per multi-row ``INSERT`` (PostgreSQL binds at most 65,535 parameters in one statement).
INSERT_CHUNK = 1000


def message_insert_many(conn: Any, rows: Sequence[dict[str, Any]]) -> None:
    """:func:`message_insert` of several rows (each as its keyword arguments), in the order given: one statement
    per :data:`INSERT_CHUNK` of them."""
    for start in range(0, len(rows), INSERT_CHUNK):
        chunk = rows[start : start + INSERT_CHUNK]
        conn.execute(
            "INSERT INTO pgbroker_messages (queue, message_id, actor, priority, eta, state, enqueued_at, body) VALUES "
            + ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s)"] * len(chunk)),
            [value for row in chunk for value in message_values(row)],
        )


def message_claim(conn: Any, queue: str, owner: str, now: int, lease_ttl_ms: int, limit: int) -> list[ClaimedRow]:
    """Lease up to *limit* READY rows of *queue* to *owner*, skipping rows other consumers are claiming."""
    rows = conn.execute(
        "WITH picked AS ("
        "  SELECT id FROM pgbroker_messages WHERE queue = %(queue)s AND state = 0"
        "  ORDER BY priority, eta, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) "
        "UPDATE pgbroker_messages AS m SET state = 1, lease_owner = %(owner)s, lease_expires = %(expires)s, "
        "deliveries = m.deliveries + 1 "
        "FROM picked WHERE m.id = picked.id "
        "RETURNING m.id, m.priority, m.eta, m.deliveries, m.body",
        {"queue": queue, "limit": limit, "owner": owner, "expires": now + lease_ttl_ms},
    ).fetchall()
    claimed = [ClaimedRow(*row) for row in rows]
    claimed.sort(key=lambda r: (r.priority, r.eta, r.id))
    return claimed


def delayed_promote(conn: Any, queue: str, now: int) -> int | None:
    """Make *queue*'s due DELAYED rows READY; returns the eta of the next row still delayed, if any.

    One statement (a consumer runs it each time its queue runs dry): the ``SELECT`` reads the snapshot
    from before the ``UPDATE``, and ``eta > now`` leaves out exactly the rows the ``UPDATE`` promotes."""
    row = conn.execute(
        "WITH promoted AS ("
        "  UPDATE pgbroker_messages SET state = 0 WHERE queue = %(queue)s AND state = 3 AND eta <= %(now)s) "
        "SELECT min(eta) FROM pgbroker_messages WHERE queue = %(queue)s AND state = 3 AND eta > %(now)s",
        {"queue": queue, "now": now},
    ).fetchone()
    return None if row[0] is None else int(row[0])


def messages_ack(conn: Any, owner: str, leases: Sequence[tuple[int, int]]) -> int:
    """Delete the settled deliveries ``(id, deliveries)`` *owner* still holds; returns how many it held."""
    if not leases:
        return 0
    ids, deliveries = zip(*leases, strict=True)
    cur = conn.execute(
        "DELETE FROM pgbroker_messages AS m USING unnest(%s::bigint[], %s::integer[]) AS l(id, deliveries) "
        "WHERE m.id = l.id AND m.deliveries = l.deliveries AND m.state = 1 AND m.lease_owner = %s",
        (list(ids), list(deliveries), owner),
    )
    return int(cur.rowcount)


def message_nack(
    conn: Any, row_id: int, owner: str, deliveries: int, body: bytes | None, now: int, reason: str
) -> bool:
    cur = conn.execute(
        "UPDATE pgbroker_messages SET state = 2, lease_owner = NULL, lease_expires = NULL, dead_at = %s, "
        "dead_reason = %s, body = coalesce(%s, body) "
        "WHERE id = %s AND state = 1 AND lease_owner = %s AND deliveries = %s",
        (now, reason, body, row_id, owner, deliveries),
    )
    return cur.rowcount == 1


def messages_release(conn: Any, owner: str, leases: Sequence[tuple[int, int]]) -> int:
    """Give back unstarted deliveries ``(id, deliveries)``: READY again, and the delivery does not count."""
    if not leases:
        return 0
    ids, deliveries = zip(*leases, strict=True)
    cur = conn.execute(
        "UPDATE pgbroker_messages AS m SET state = 0, lease_owner = NULL, lease_expires = NULL, "
        "deliveries = m.deliveries - 1 "
        "FROM unnest(%s::bigint[], %s::integer[]) AS l(id, deliveries) "
        "WHERE m.id = l.id AND m.deliveries = l.deliveries AND m.state = 1 AND m.lease_owner = %s",
        (list(ids), list(deliveries), owner),
    )
    return int(cur.rowcount)


def messages_kill(conn: Any, row_ids: Sequence[int], now: int, reason: str) -> int:
    """Dead-letter rows this transaction just leased (undecodable or poison messages)."""
    if not row_ids:
        return 0
    cur = conn.execute(
        "UPDATE pgbroker_messages SET state = 2, lease_owner = NULL, lease_expires = NULL, dead_at = %s, "
        "dead_reason = %s WHERE id = ANY(%s) AND state = 1",
        (now, reason, list(row_ids)),
    )
    return int(cur.rowcount)


def lease_extend(conn: Any, owner: str, row_ids: Sequence[int], now: int, lease_ttl_ms: int) -> int:
    """Renew the leases *owner* still holds on *row_ids* (buffered and running deliveries)."""
    if not row_ids:
        return 0
    cur = conn.execute(
        "UPDATE pgbroker_messages SET lease_expires = %s WHERE id = ANY(%s) AND state = 1 AND lease_owner = %s",
        (now + lease_ttl_ms, list(row_ids), owner),
    )
    return int(cur.rowcount)


def lease_reap_expired(conn: Any, now: int) -> list[str]:
    """Return expired leases to READY; the queues that got rows back, one entry per row."""
    rows = conn.execute(
        "UPDATE pgbroker_messages SET state = 0, lease_owner = NULL, lease_expires = NULL "
        "WHERE state = 1 AND lease_expires < %s RETURNING queue",
        (now,),
    ).fetchall()
    return [r[0] for r in rows]


def dead_purge(conn: Any, dead_before: int) -> int:
    return int(conn.execute("DELETE FROM pgbroker_messages WHERE state = 2 AND dead_at < %s", (dead_before,)).rowcount)


def queue_flush(conn: Any, queue: str) -> int:
    return int(conn.execute("DELETE FROM pgbroker_messages WHERE queue = %s", (queue,)).rowcount)


def queue_pending_count(conn: Any, queue: str) -> int:
    """Messages of *queue* not settled yet (ready, delayed or leased)."""
    return int(
        conn.execute(
            "SELECT count(*) FROM pgbroker_messages WHERE queue = %s AND state IN (0, 1, 3)", (queue,)
        ).fetchone()[0]
    )


def queue_stats(conn: Any, now: int) -> list[QueueStats]:
    """Counts per queue and state, the oldest ready message's age, and leases past their expiry."""
    rows = conn.execute(
        "SELECT queue, "
        "  count(*) FILTER (WHERE state = 0), count(*) FILTER (WHERE state = 3), "
        "  count(*) FILTER (WHERE state = 1), count(*) FILTER (WHERE state = 2), "
        "  min(eta) FILTER (WHERE state = 0), count(*) FILTER (WHERE state = 1 AND lease_expires < %s) "
        "FROM pgbroker_messages GROUP BY queue ORDER BY queue",
        (now,),
    ).fetchall()
    return [
        QueueStats(
            queue=queue,
            ready=ready,
            delayed=delayed,
            leased=leased,
            dead=dead,
            oldest_ready_age_ms=None if oldest is None else max(0, now - int(oldest)),
            paused=False,
            expired_leases=expired,
        )
        for queue, ready, delayed, leased, dead, oldest, expired in rows
    ]
