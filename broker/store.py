"""All SQL of the SQLite broker.

Tables (see ``schema.sql``): ``broker_messages`` (one row per enqueued message; READY/LEASED/DEAD),
``broker_queues`` (declared queues, paused flag), ``broker_processes`` (live lease owners and their
wake addresses), ``broker_meta`` (schema version). Results and rate limits have their own stores.

Invariants the queries keep:
- a LEASED row has an owner and an expiry, other rows have neither (CHECK);
- every write made on behalf of a delivery is fenced by ``(id, lease_owner, deliveries)``: a row
  that was reclaimed and leased again no longer matches, so a stale ack/nack/requeue touches nothing;
- claims run in ``BEGIN IMMEDIATE`` and take rows in (priority, eta, id) order.

One method per query; callers pass the connection so several queries can share one transaction.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

from .connection import SQLiteTarget, check_location, check_sqlite_version, connect
from .errors import UnsupportedDatabase, translate_errors
from .writer_queue import process_write_lock

logger = logging.getLogger(__name__)

#: Rows per multi-row statement (an ``INSERT`` of messages binds 8,000 parameters, an ack ``DELETE`` 3,001: SQLite
#: binds at most 32,766 in one statement).
ROWS_PER_STATEMENT = 1000

#: Version of ``schema.sql``; a database recording a newer one is refused.
SCHEMA_VERSION = 1

READY, LEASED, DEAD, DELAYED = 0, 1, 2, 3
STATE_NAMES = {READY: "ready", LEASED: "leased", DEAD: "dead", DELAYED: "delayed"}


def schema_sql() -> str:
    """The broker's DDL, as shipped in ``broker/schema.sql``."""
    return resources.files(__package__).joinpath("schema.sql").read_text(encoding="utf-8")


@dataclass(frozen=True)
class ClaimedRow:
    id: int
    priority: int
    eta: int
    deliveries: int
    body: bytes


@dataclass(frozen=True)
class DeadLetter:
    id: int
    queue: str
    message_id: str
    actor: str
    dead_at: int
    reason: str | None
    deliveries: int
    body: bytes


@dataclass(frozen=True)
class DeadMatch:
    """Which dead letters a bulk replay or purge takes (every given condition must hold).

    Attributes:
      queue: Canonical queue name (None: every queue).
      actor: Actor name (None: every actor).
      dead_before: Dead-lettered before this instant, epoch ms (None: whenever).
      through_id: Row id at most this, so that an action confirmed after a dry run takes only what the
        dry run counted, not letters that died since (None: no bound).
    """

    queue: str | None = None
    actor: str | None = None
    dead_before: int | None = None
    through_id: int | None = None


@dataclass(frozen=True)
class QueueStats:
    queue: str
    ready: int
    delayed: int
    leased: int
    dead: int
    oldest_ready_age_ms: int | None
    paused: bool
    #: Leased rows whose lease expired and that no reaper has returned to READY yet.
    expired_leases: int = 0


def message_state(eta: int, enqueued_at: int) -> int:
    """The state a new message row starts in (both brokers' stores): READY when due at once, DELAYED otherwise."""
    return DELAYED if eta > enqueued_at else READY


def message_values(row: dict[str, Any]) -> tuple[Any, ...]:
    """A message row's column values, in the order ``(queue, message_id, actor, priority, eta, state,
    enqueued_at, body)``."""
    return (
        row["queue"],
        row["message_id"],
        row["actor"],
        row["priority"],
        row["eta"],
        message_state(row["eta"], row["enqueued_at"]),
        row["enqueued_at"],
        row["body"],
    )


class MessageStore:
    """Per-thread connections to one SQLite file plus the broker's queries."""

    def __init__(self, target: SQLiteTarget) -> None:
        check_sqlite_version()
        check_location(target.path)
        self.target = target
        self._local = threading.local()
        self._lock = threading.Lock()
        self._generation = 0
        self._pid = os.getpid()

    # -- connections -------------------------------------------------------------------------------
    def is_own(self, conn: sqlite3.Connection) -> bool:
        """Whether *conn* is this thread's connection of this store (so, by construction, on its file)."""
        return self._pid == os.getpid() and getattr(self._local, "conn", None) is conn

    def conn(self) -> sqlite3.Connection:
        """This thread's connection (a new one after fork: SQLite connections never cross fork)."""
        if self._pid != os.getpid():
            self.reset_after_fork()
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is not None and local.generation != self._generation:
            # The store was closed since this thread opened it: close it here, on its own thread.
            _close_quietly(conn)
            conn = None
        if conn is None:
            with translate_errors():
                conn = connect(self.target)
            local.conn, local.generation = conn, self._generation
        return conn

    def reset_after_fork(self) -> None:
        # The parent's connections are abandoned, not closed: closing them in the child could
        # release locks the parent still holds.
        self._local = threading.local()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def close(self) -> None:
        """Close this thread's connection; other threads' close on their next use or when they end.

        A sqlite3 connection must never be closed while another thread is inside a call on it
        (that crashes the interpreter), so connections are only ever closed by their own thread;
        a finished thread's connection is closed when its thread-local storage is released.
        """
        with self._lock:
            self._generation += 1
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            self._local.conn = None
            _close_quietly(conn)

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` transaction on this thread's connection, committed on success.

        Writers queue first (:mod:`broker.writer_queue`: this process's threads, then every process):
        SQLite's busy handler sleeps 1, 2, 5 … ms when the write lock is taken, so writers would
        otherwise add milliseconds of latency to each other.
        """
        conn = self.conn()
        local = self._local
        committed: dict[Hashable, Callable[[], None]] = {}
        with process_write_lock(self.target.path), translate_errors():
            conn.execute("BEGIN IMMEDIATE")
            local.on_commit = committed
            try:
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            finally:
                local.on_commit = None
        for fn in committed.values():
            try:
                fn()
            except Exception:  # the transaction has committed: its caller must not take it for failed
                logger.exception("An after-commit callback of the broker's transaction failed.")

    def on_commit(self, conn: sqlite3.Connection, key: Hashable, fn: Callable[[], None]) -> bool:
        """Run *fn* once the :meth:`write` transaction open on *conn* commits (never if it rolls back); one
        *fn* per *key* and transaction. False, and nothing registered, when *conn* is not this thread's
        connection inside :meth:`write` (a caller's own transaction: this store cannot see its commit)."""
        committed = getattr(self._local, "on_commit", None) if self.is_own(conn) else None
        if committed is None:
            return False
        committed.setdefault(key, fn)
        return True

    def insert_autocommit(self, **row: object) -> int:
        """One INSERT as its own transaction: a single statement needs no BEGIN/COMMIT round trips."""
        conn = self.conn()
        with process_write_lock(self.target.path), translate_errors():
            return self.message_insert(conn, **row)  # type: ignore[arg-type]

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        conn = self.conn()
        with translate_errors():
            yield conn

    # -- schema ------------------------------------------------------------------------------------
    def schema_ensure(self) -> None:
        """Create the broker's tables if missing; refuse a database from a newer broker.

        The version is read on a read-only connection first, so a refused file is left
        byte-identical (opening it normally would already switch it to WAL mode).
        """
        self._check_version_read_only()
        with self.write() as conn:
            self._check_version(conn)
            # Every statement is idempotent, so additions made within a version (a new index) reach
            # existing files too.
            for statement in _split_sql(schema_sql()):
                conn.execute(statement)

    def schema_ensure_on(self, conn: sqlite3.Connection) -> None:
        """:meth:`schema_ensure` inside a caller's open transaction (nothing is committed here)."""
        with translate_errors():
            self._check_version(conn)
            for statement in _split_sql(schema_sql()):
                conn.execute(statement)

    def _check_version_read_only(self) -> None:
        if not os.path.exists(self.target.path) or os.path.getsize(self.target.path) == 0:
            return
        uri = "file:" + urllib.parse.quote(os.path.abspath(self.target.path)) + "?mode=ro"
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=self.target.busy_timeout_ms / 1000)
        except sqlite3.Error:
            return  # not readable read-only (e.g. WAL without -shm): the write path checks again
        try:
            with translate_errors():
                self._check_version(conn)
        finally:
            conn.close()

    def _check_version(self, conn: sqlite3.Connection) -> None:
        exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'broker_meta'").fetchone()
        if not exists:
            return
        row = conn.execute("SELECT value FROM broker_meta WHERE key = 'schema_version'").fetchone()
        version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise UnsupportedDatabase(
                f"{self.target.path} has broker schema version {version}; this broker knows "
                f"up to {SCHEMA_VERSION}. Upgrade Tenure or point it at another database."
            )

    # -- messages ----------------------------------------------------------------------------------
    @staticmethod
    def message_insert(
        conn: sqlite3.Connection,
        *,
        queue: str,
        message_id: str,
        actor: str,
        priority: int,
        eta: int,
        enqueued_at: int,
        body: bytes,
    ) -> int:
        cur = conn.execute(
            "INSERT INTO broker_messages (queue, message_id, actor, priority, eta, state, enqueued_at, body) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (queue, message_id, actor, priority, eta, message_state(eta, enqueued_at), enqueued_at, body),
        )
        return int(cur.lastrowid or 0)

    @staticmethod
    def message_insert_many(conn: sqlite3.Connection, rows: Sequence[dict[str, Any]]) -> None:
        """:meth:`message_insert` of several rows (each as its keyword arguments), in the order given: one
        statement per :data:`ROWS_PER_STATEMENT` of them. Not ``executemany``: it runs the statement once per row,
        and while SQLite runs one the GIL is free, a busy worker thread takes it, and the ack writer (whose
        transaction a window refill's messages are written in) waits to get it back."""
        for start in range(0, len(rows), ROWS_PER_STATEMENT):
            chunk = rows[start : start + ROWS_PER_STATEMENT]
            conn.execute(
                "INSERT INTO broker_messages (queue, message_id, actor, priority, eta, state, enqueued_at, body) "
                "VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * len(chunk)),
                [value for row in chunk for value in message_values(row)],
            )

    @staticmethod
    def message_claim(
        conn: sqlite3.Connection, queue: str, owner: str, now: int, lease_ttl_ms: int, limit: int
    ) -> list[ClaimedRow]:
        """Lease up to *limit* READY rows of an unpaused queue to *owner*, promoting due DELAYED rows first."""
        conn.execute("UPDATE broker_messages SET state = 0 WHERE queue = ? AND state = 3 AND eta <= ?", (queue, now))
        rows = conn.execute(
            "UPDATE broker_messages SET state = 1, lease_owner = :owner, lease_expires = :expires, "
            "deliveries = deliveries + 1 "
            # INDEXED BY: the (queue, priority, eta, id) order lets the scan stop after :limit rows; the
            # planner would otherwise pick the (queue, eta) index and sort every due row.
            "WHERE id IN (SELECT id FROM broker_messages INDEXED BY broker_messages_ready "
            "  WHERE queue = :queue AND state = 0 AND eta <= :now "
            "  AND NOT EXISTS (SELECT 1 FROM broker_queues WHERE name = :queue AND paused = 1) "
            "  ORDER BY priority, eta, id LIMIT :limit) "
            "RETURNING id, priority, eta, deliveries, body",
            {"owner": owner, "expires": now + lease_ttl_ms, "queue": queue, "now": now, "limit": limit},
        ).fetchall()
        claimed = [ClaimedRow(*row) for row in rows]
        claimed.sort(key=lambda r: (r.priority, r.eta, r.id))
        return claimed

    @staticmethod
    def message_ready_probe(conn: sqlite3.Connection, queue: str, now: int) -> bool:
        """Cheap read before taking the write lock: is anything due on *queue*?"""
        return (
            conn.execute(
                "SELECT 1 FROM broker_messages WHERE queue = ? AND state = 0 AND eta <= ? LIMIT 1",
                (queue, now),
            ).fetchone()
            is not None
            or conn.execute(
                "SELECT 1 FROM broker_messages WHERE queue = ? AND state = 3 AND eta <= ? LIMIT 1",
                (queue, now),
            ).fetchone()
            is not None
        )

    @staticmethod
    def message_next_eta(conn: sqlite3.Connection, queue: str, now: int) -> int | None:
        row = conn.execute(
            "SELECT min(eta) FROM broker_messages WHERE queue = ? AND state = 3 AND eta > ?", (queue, now)
        ).fetchone()
        return None if row[0] is None else int(row[0])

    @staticmethod
    def message_ack_many(conn: sqlite3.Connection, owner: str, leases: Sequence[tuple[int, int]]) -> set[int]:
        """Delete the messages of *leases* (``(row id, deliveries)``) that *owner* still leases as that delivery,
        in one statement per :data:`ROWS_PER_STATEMENT` of them; the row ids deleted. Not one a message: while
        SQLite runs a statement the GIL is free, a busy worker thread takes it, and the ack writer waits to get
        it back.

        ``deliveries = CASE id …``, not ``(id, deliveries) IN (VALUES …)``: SQLite's planner reads the latter
        through the owner's index, every row the owner leases, and the former by primary key."""
        deleted: set[int] = set()
        for start in range(0, len(leases), ROWS_PER_STATEMENT):  # 3,001 parameters a statement at most
            chunk = leases[start : start + ROWS_PER_STATEMENT]
            ids = ", ".join("?" * len(chunk))
            cases = " ".join("WHEN ? THEN ?" for _ in chunk)
            rows = conn.execute(
                f"DELETE FROM broker_messages WHERE id IN ({ids}) AND state = 1 AND lease_owner = ? "
                f"AND deliveries = CASE id {cases} END RETURNING id",
                [row_id for row_id, _ in chunk] + [owner] + [v for lease in chunk for v in lease],
            ).fetchall()
            deleted.update(row_id for (row_id,) in rows)
        return deleted

    @staticmethod
    def message_nack(
        conn: sqlite3.Connection,
        row_id: int,
        owner: str,
        deliveries: int,
        body: bytes | None,
        now: int,
        reason: str,
    ) -> bool:
        cur = conn.execute(
            "UPDATE broker_messages SET state = 2, lease_owner = NULL, lease_expires = NULL, dead_at = ?, "
            "dead_reason = ?, body = coalesce(?, body) "
            "WHERE id = ? AND state = 1 AND lease_owner = ? AND deliveries = ?",
            (now, reason, body, row_id, owner, deliveries),
        )
        return cur.rowcount == 1

    @staticmethod
    def message_requeue(conn: sqlite3.Connection, row_id: int, owner: str, deliveries: int) -> bool:
        """Give back an unstarted delivery: READY again, and the delivery does not count."""
        cur = conn.execute(
            "UPDATE broker_messages SET state = 0, lease_owner = NULL, lease_expires = NULL, "
            "deliveries = deliveries - 1 "
            "WHERE id = ? AND state = 1 AND lease_owner = ? AND deliveries = ?",
            (row_id, owner, deliveries),
        )
        return cur.rowcount == 1

    @staticmethod
    def message_kill(conn: sqlite3.Connection, row_ids: Iterable[int], now: int, reason: str) -> int:
        """Dead-letter rows this transaction just leased (undecodable or poison messages)."""
        n = 0
        for row_id in row_ids:
            n += conn.execute(
                "UPDATE broker_messages SET state = 2, lease_owner = NULL, lease_expires = NULL, "
                "dead_at = ?, dead_reason = ? WHERE id = ? AND state = 1",
                (now, reason, row_id),
            ).rowcount
        return n

    @staticmethod
    def message_expedite(
        conn: sqlite3.Connection, queue: str, option: str, values: Sequence[str], now: int
    ) -> list[str]:
        """Make DELAYED rows of *queue* whose message option *option* is one of *values* due now.

        Returns the option values of the rows it changed (one entry per row). Only JSON-encoded
        bodies can match (Dramatiq's default encoder); others are left as they are.
        """
        if not values or not option.replace("_", "").isalnum():
            return []
        path = f'$.options."{option}"'
        marks = ", ".join("?" for _ in values)
        rows = conn.execute(
            "UPDATE broker_messages SET state = 0, eta = ? "
            "WHERE queue = ? AND state = 3 AND json_valid(CAST(body AS TEXT)) "
            f"AND json_extract(CAST(body AS TEXT), ?) IN ({marks}) "
            "RETURNING json_extract(CAST(body AS TEXT), ?)",
            (now, queue, path, *values, path),
        ).fetchall()
        return [str(r[0]) for r in rows]

    # -- leases ------------------------------------------------------------------------------------
    @staticmethod
    def lease_extend(conn: sqlite3.Connection, owner: str, row_ids: Sequence[int], now: int, lease_ttl_ms: int) -> int:
        """Renew the leases *owner* still holds on *row_ids* (buffered and running deliveries)."""
        if not row_ids:
            return 0
        return conn.execute(
            "UPDATE broker_messages SET lease_expires = ? WHERE state = 1 AND lease_owner = ? "
            "AND id IN (SELECT value FROM json_each(?))",
            (now + lease_ttl_ms, owner, json.dumps(list(row_ids))),
        ).rowcount

    @staticmethod
    def lease_reap_expired(conn: sqlite3.Connection, now: int) -> list[str]:
        """Return expired leases to READY; the queues that got rows back, one entry per row."""
        rows = conn.execute(
            "UPDATE broker_messages SET state = 0, lease_owner = NULL, lease_expires = NULL "
            "WHERE state = 1 AND lease_expires < ? RETURNING queue",
            (now,),
        ).fetchall()
        return [r[0] for r in rows]

    @staticmethod
    def lease_expired_count(conn: sqlite3.Connection, now: int) -> int:
        return conn.execute(
            "SELECT count(*) FROM broker_messages WHERE state = 1 AND lease_expires < ?", (now,)
        ).fetchone()[0]

    @staticmethod
    def lease_release_owner(conn: sqlite3.Connection, owner: str, leases: Sequence[tuple[int, int]]) -> int:
        """Give back unstarted deliveries ``(id, deliveries)`` held by *owner* (graceful shutdown)."""
        n = 0
        for row_id, deliveries in leases:
            n += MessageStore.message_requeue(conn, row_id, owner, deliveries)
        return n

    # -- dead letters ------------------------------------------------------------------------------
    @staticmethod
    def dead_purge(conn: sqlite3.Connection, dead_before: int) -> int:
        return conn.execute("DELETE FROM broker_messages WHERE state = 2 AND dead_at < ?", (dead_before,)).rowcount

    @staticmethod
    def dead_list(
        conn: sqlite3.Connection, queue: str | None, limit: int, after_id: int = 0, actor: str | None = None
    ) -> list[DeadLetter]:
        rows = conn.execute(
            "SELECT id, queue, message_id, actor, dead_at, dead_reason, deliveries, body FROM broker_messages "
            "WHERE state = 2 AND (:queue IS NULL OR queue = :queue) AND (:actor IS NULL OR actor = :actor) "
            "AND id > :after ORDER BY id LIMIT :limit",
            {"queue": queue, "actor": actor, "after": after_id, "limit": limit},
        ).fetchall()
        return [DeadLetter(*r) for r in rows]

    @staticmethod
    def dead_delete(conn: sqlite3.Connection, queue: str, ids: Sequence[int] | None) -> int:
        sql = "DELETE FROM broker_messages WHERE state = 2 AND queue = ?"
        if ids is None:
            return conn.execute(sql, (queue,)).rowcount
        return sum(conn.execute(sql + " AND id = ?", (queue, i)).rowcount for i in ids)

    def _dead_matching(match: DeadMatch, limit: int) -> tuple[str, dict[str, object]]:
        """The ids of the oldest *limit* dead letters *match* selects, as a sub-query and its parameters."""
        return (
            "SELECT id FROM broker_messages WHERE state = 2 AND (:queue IS NULL OR queue = :queue) "
            "AND (:actor IS NULL OR actor = :actor) AND (:before IS NULL OR dead_at < :before) "
            "AND (:through IS NULL OR id <= :through) ORDER BY id LIMIT :limit",
            {
                "queue": match.queue,
                "actor": match.actor,
                "before": match.dead_before,
                "through": match.through_id,
                "limit": limit,
            },
        )

    @staticmethod
    def dead_match_count(conn: sqlite3.Connection, match: DeadMatch) -> int:
        """How many dead letters *match* selects."""
        sub, params = MessageStore._dead_matching(match, -1)
        return int(conn.execute(f"SELECT count(*) FROM ({sub})", params).fetchone()[0])

    @staticmethod
    def dead_match_ids(conn: sqlite3.Connection, match: DeadMatch, limit: int) -> list[int]:
        """The row ids of the oldest *limit* dead letters *match* selects, ascending."""
        sub, params = MessageStore._dead_matching(match, limit)
        return [r[0] for r in conn.execute(sub, params).fetchall()]

    @staticmethod
    def dead_replay_matching(conn: sqlite3.Connection, match: DeadMatch, limit: int, now: int) -> list[str]:
        """Move the oldest *limit* dead letters *match* selects back to READY; their queues, one per row."""
        sub, params = MessageStore._dead_matching(match, limit)
        rows = conn.execute(
            "UPDATE broker_messages SET state = 0, eta = :now, deliveries = 0, dead_at = NULL, dead_reason = NULL "
            f"WHERE id IN ({sub}) RETURNING queue",
            {**params, "now": now},
        ).fetchall()
        return [r[0] for r in rows]

    @staticmethod
    def dead_delete_matching(conn: sqlite3.Connection, match: DeadMatch, limit: int) -> int:
        """Delete the oldest *limit* dead letters *match* selects."""
        sub, params = MessageStore._dead_matching(match, limit)
        return conn.execute(f"DELETE FROM broker_messages WHERE id IN ({sub})", params).rowcount

    @staticmethod
    def dead_replay(conn: sqlite3.Connection, queue: str, ids: Sequence[int] | None, now: int) -> int:
        sql = (
            "UPDATE broker_messages SET state = 0, eta = ?, deliveries = 0, dead_at = NULL, dead_reason = NULL "
            "WHERE state = 2 AND queue = ?"
        )
        if ids is None:
            return conn.execute(sql, (now, queue)).rowcount
        return sum(conn.execute(sql + " AND id = ?", (now, queue, i)).rowcount for i in ids)

    # -- queues ------------------------------------------------------------------------------------
    @staticmethod
    def queue_declare(conn: sqlite3.Connection, name: str, now: int) -> None:
        conn.execute("INSERT OR IGNORE INTO broker_queues (name, declared_at) VALUES (?, ?)", (name, now))

    @staticmethod
    def queue_set_paused(conn: sqlite3.Connection, name: str, paused: bool, now: int) -> None:
        conn.execute(
            "INSERT INTO broker_queues (name, paused, declared_at) VALUES (?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET paused = excluded.paused",
            (name, int(paused), now),
        )

    @staticmethod
    def queue_stats(conn: sqlite3.Connection, now: int) -> list[QueueStats]:
        """Counts per queue and state from the per-state partial indexes (index-only scans), so a
        scrape stays fast with millions of rows and inserts pay for one index only."""
        counts: dict[str, dict[int, int]] = {}
        for state, index in ((READY, "ready"), (DELAYED, "delayed"), (DEAD, "dead")):
            for queue, n in conn.execute(
                f"SELECT queue, count(*) FROM broker_messages INDEXED BY broker_messages_{index} "
                f"WHERE state = {state} GROUP BY queue"
            ):
                counts.setdefault(queue, {})[state] = n
        for queue, n in conn.execute("SELECT queue, count(*) FROM broker_messages WHERE state = 1 GROUP BY queue"):
            counts.setdefault(queue, {})[LEASED] = n
        paused = dict(conn.execute("SELECT name, paused FROM broker_queues").fetchall())
        expired = dict(
            conn.execute(
                "SELECT queue, count(*) FROM broker_messages WHERE state = 1 AND lease_expires < ? GROUP BY queue",
                (now,),
            ).fetchall()
        )
        stats = []
        for queue in sorted(set(counts) | set(paused)):
            c = counts.get(queue, {})
            oldest = None
            if c.get(READY):
                oldest = conn.execute(
                    "SELECT min(eta) FROM broker_messages INDEXED BY broker_messages_ready "
                    "WHERE queue = ? AND state = 0",
                    (queue,),
                ).fetchone()[0]
            stats.append(
                QueueStats(
                    queue=queue,
                    ready=c.get(READY, 0),
                    delayed=c.get(DELAYED, 0),
                    leased=c.get(LEASED, 0),
                    dead=c.get(DEAD, 0),
                    oldest_ready_age_ms=None if oldest is None else max(0, now - oldest),
                    paused=bool(paused.get(queue, 0)),
                    expired_leases=expired.get(queue, 0),
                )
            )
        return stats

    @staticmethod
    def queue_pending_count(conn: sqlite3.Connection, queue: str) -> int:
        """Messages not yet finished (READY, delayed or LEASED) on *queue*.

        One statement, so one snapshot: counted one state at a time, a message acked between the counts could
        take its successor with it (an ``on_success`` callback's message READY after the READY count, the
        acked one gone before the LEASED count), and a join returned with that message still to run."""
        counts = " + ".join(
            f"(SELECT count(*) FROM broker_messages WHERE queue = :q AND state = {state})"
            for state in (READY, DELAYED, LEASED)
        )  # one per state: each uses its partial index (there is no plain index on queue)
        return int(conn.execute(f"SELECT {counts}", {"q": queue}).fetchone()[0])

    @staticmethod
    def queue_flush(conn: sqlite3.Connection, queue: str) -> int:
        # One delete per state so each uses its partial index (there is no plain index on queue).
        return sum(
            conn.execute(f"DELETE FROM broker_messages WHERE queue = ? AND state = {state}", (queue,)).rowcount
            for state in (READY, DELAYED, LEASED, DEAD)
        )

    # -- processes ---------------------------------------------------------------------------------
    @staticmethod
    def process_register(
        conn: sqlite3.Connection, owner: str, host: str, pid: int, wake_addr: str | None, queues: str, now: int
    ) -> None:
        conn.execute(
            "INSERT INTO broker_processes (owner, host, pid, wake_addr, queues, started_at, heartbeat_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (owner) DO UPDATE SET wake_addr = excluded.wake_addr, "
            "queues = excluded.queues, heartbeat_at = excluded.heartbeat_at",
            (owner, host, pid, wake_addr, queues, now, now),
        )

    @staticmethod
    def process_heartbeat(conn: sqlite3.Connection, owner: str, now: int) -> int:
        return conn.execute("UPDATE broker_processes SET heartbeat_at = ? WHERE owner = ?", (now, owner)).rowcount

    @staticmethod
    def process_unregister(conn: sqlite3.Connection, owner: str) -> None:
        conn.execute("DELETE FROM broker_processes WHERE owner = ?", (owner,))

    @staticmethod
    def process_reap(conn: sqlite3.Connection, heartbeat_before: int, now: int) -> int:
        """Forget processes that stopped heartbeating, recording each as an unclean exit."""
        conn.execute(
            "INSERT OR IGNORE INTO broker_unclean_exits (owner, host, pid, started_at, last_heartbeat_at, detected_at) "
            "SELECT owner, host, pid, started_at, heartbeat_at, ? FROM broker_processes WHERE heartbeat_at < ?",
            (now, heartbeat_before),
        )
        return conn.execute("DELETE FROM broker_processes WHERE heartbeat_at < ?", (heartbeat_before,)).rowcount

    @staticmethod
    def process_list_on_host(conn: sqlite3.Connection, host: str) -> list[tuple[str, int]]:
        return conn.execute("SELECT owner, pid FROM broker_processes WHERE host = ?", (host,)).fetchall()

    @staticmethod
    def process_mark_unclean(conn: sqlite3.Connection, owners: Sequence[str], now: int) -> None:
        """Move rows of processes known to be dead (same host, pid gone) to the unclean exits."""
        for owner in owners:
            conn.execute(
                "INSERT OR IGNORE INTO broker_unclean_exits (owner, host, pid, started_at, last_heartbeat_at, "
                "detected_at) SELECT owner, host, pid, started_at, heartbeat_at, ? FROM broker_processes "
                "WHERE owner = ?",
                (now, owner),
            )
            conn.execute("DELETE FROM broker_processes WHERE owner = ?", (owner,))

    @staticmethod
    def unclean_report(conn: sqlite3.Connection, now: int) -> tuple[int, int | None]:
        """``(count, earliest start)`` of unreported unclean exits; marks them reported."""
        count, since = conn.execute(
            "SELECT count(*), min(started_at) FROM broker_unclean_exits WHERE reported_at IS NULL"
        ).fetchone()
        if count:
            conn.execute("UPDATE broker_unclean_exits SET reported_at = ? WHERE reported_at IS NULL", (now,))
        return count, since

    @staticmethod
    def unclean_list(conn: sqlite3.Connection, limit: int) -> list[tuple]:
        return conn.execute(
            "SELECT owner, host, pid, started_at, last_heartbeat_at, detected_at, reported_at "
            "FROM broker_unclean_exits ORDER BY detected_at DESC LIMIT ?",
            (limit,),
        ).fetchall()

    @staticmethod
    def unclean_delete(conn: sqlite3.Connection, owners: Sequence[str]) -> int:
        """Forget the unclean exits of *owners* (an operator acknowledged them)."""
        return sum(
            conn.execute("DELETE FROM broker_unclean_exits WHERE owner = ?", (owner,)).rowcount for owner in owners
        )

    @staticmethod
    def process_wake_addrs(conn: sqlite3.Connection, host: str, alive_after: int) -> list[tuple[str, str]]:
        """``(wake_addr, queues)`` of live consumer processes on this host."""
        return conn.execute(
            "SELECT wake_addr, queues FROM broker_processes WHERE host = ? AND wake_addr IS NOT NULL "
            "AND heartbeat_at >= ?",
            (host, alive_after),
        ).fetchall()

    @staticmethod
    def process_list(conn: sqlite3.Connection) -> list[tuple]:
        return conn.execute(
            "SELECT p.owner, p.host, p.pid, p.queues, p.started_at, p.heartbeat_at, "
            "(SELECT count(*) FROM broker_messages m WHERE m.state = 1 AND m.lease_owner = p.owner) "
            "FROM broker_processes p ORDER BY p.started_at"
        ).fetchall()

    # -- maintenance -------------------------------------------------------------------------------
    def wal_checkpoint(self) -> tuple[int, int, int]:
        """Checkpoint the WAL without ever blocking writers for long.

        A dedicated connection with a tiny busy timeout runs PASSIVE (never blocks); only when that
        copied the whole log does it TRUNCATE the file. A reader pinning an old snapshot therefore
        costs disk space, not stalled enqueues.
        """
        conn = sqlite3.connect(self.target.path, timeout=0.02, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout = 20")
            busy, log, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if busy == 0 and log == done and log > 0:
                busy, log, done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            return busy, log, done
        except sqlite3.OperationalError:
            return 1, -1, -1
        finally:
            conn.close()


def _close_quietly(conn: sqlite3.Connection) -> None:
    try:
        conn.close()
    except sqlite3.Error:
        pass


def _split_sql(script: str) -> list[str]:
    """Split a DDL script into statements (the schema has no semicolons inside statements)."""
    lines = [line for line in script.splitlines() if not line.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
