"""SQLiteBroker: a Dramatiq broker whose messages are lease rows in one SQLite file."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import queue
import signal
import socket
import sqlite3
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from dramatiq.common import current_millis, q_name
from dramatiq.errors import DecodeError, QueueNotFound
from dramatiq.message import Message
from dramatiq.middleware import Middleware, SkipMessage

from .acks import AckWriter, CallBatch, Settlement
from .checkpoints import WalCheckpointer
from .connection import SQLiteTarget, parse_sqlite_url
from .consumer import PrefetchSlots, SQLiteMessageProxy, _SQLiteConsumer
from .errors import UnsupportedDatabase
from .leased import (
    DEFAULT_DEAD_MESSAGE_TTL_MS,
    DEFAULT_LEASE_TTL_MS,
    DEFAULT_MAX_DELIVERIES,
    DEFAULT_REAP_INTERVAL_S,
    MAX_CLAIM_BATCH,
    LeaseBroker,
    after_fork,
    check_lease_options,
    dead_letter,
)
from .leases import LeaseKeeper
from .store import DeadLetter, DeadMatch, MessageStore, QueueStats
from .wakeup import Listener, LocalWaiters, Nudger, namespace_for

T = TypeVar("T")
logger = logging.getLogger(__name__)

#: Default database location, relative to the working directory.
DEFAULT_URL = "sqlite:///var/tenure.db"
#: A second SIGTERM within this many seconds of the first is the same stop request, not "kill now".
REPEATED_SIGTERM_WINDOW_S = 2.0


@dataclass
class _Held:
    deliveries: int
    queue: str
    started: bool = False


class SQLiteBroker(LeaseBroker):
    """A Dramatiq broker storing messages as leased rows in a SQLite file (WAL mode).

    Delivery is at least once: a consumer process leases rows, renews the leases while it holds
    them, and acks/nacks fenced on its lease. A process that dies stops renewing; its rows become
    READY again after ``lease_ttl_ms``. Delays are native (an ``eta`` column), so the Worker's
    ``.DQ`` consumers stay idle and nothing is held in memory.

    Parameters:
      url: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or a plain path.
      middleware: As :class:`dramatiq.Broker`; ``None`` means Dramatiq's default middleware.
      lease_ttl_ms: Lease lifetime without a heartbeat (≥ 1000). Heartbeats run at a third of it.
      max_deliveries: Redeliveries (lease expiries) after which a message is dead-lettered as poison.
      dead_message_ttl_ms: How long dead letters are kept.
      synchronous: ``"NORMAL"`` (no fsync per commit; survives process crashes) or ``"FULL"``
        (fsync per commit; also survives power loss).
      busy_timeout_ms: How long to wait for SQLite's write lock before raising ``ConnectionClosed``.

    Raises:
      UnsupportedDatabase: SQLite older than 3.35, a network filesystem, or a newer schema.
      ValueError: A lease TTL under one second or an unknown ``synchronous`` mode.
    """

    proxy_class: type[SQLiteMessageProxy] = SQLiteMessageProxy

    def __init__(
        self,
        url: str = DEFAULT_URL,
        middleware: list[Middleware] | None = None,
        *,
        lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS,
        max_deliveries: int = DEFAULT_MAX_DELIVERIES,
        dead_message_ttl_ms: int = DEFAULT_DEAD_MESSAGE_TTL_MS,
        synchronous: str = "NORMAL",
        busy_timeout_ms: int = 30_000,
        reap_interval_s: float = DEFAULT_REAP_INTERVAL_S,
    ) -> None:
        check_lease_options(lease_ttl_ms, max_deliveries)
        synchronous = synchronous.upper()
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        super().__init__(middleware)
        self.queues: set[str] = set()  # type: ignore[assignment]
        self.url = url
        self.target = SQLiteTarget(parse_sqlite_url(url), synchronous, busy_timeout_ms)
        self.lease_ttl_ms = lease_ttl_ms
        self.max_deliveries = max_deliveries
        self.dead_message_ttl_ms = dead_message_ttl_ms
        self.reap_interval_s = min(reap_interval_s, lease_ttl_ms / 3000)
        self.store = MessageStore(self.target)
        self.leases_lost = 0
        self.leases_reclaimed = 0
        #: ``(count, earliest start ms)`` of unclean exits this process reported at start, if any.
        self.unclean_exits_reported: tuple[int, int | None] | None = None
        self.heartbeat_failures = 0
        self._namespace = namespace_for(self.target.path)
        self._waiters = LocalWaiters()
        self._nudger = Nudger(self._fetch_listeners, lambda: self._listener.address if self._listener else None)
        self._init_process_state()
        self._schema_lock = threading.Lock()
        self._schema_ready = False
        self._schema_pid = -1
        after_fork.add(self)

    # -- process-local state (regenerated after fork) ----------------------------------------------
    def _init_process_state(self) -> None:
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._pid = os.getpid()
        self._state_lock = threading.Lock()
        self._held: dict[int, _Held] = {}
        self._released: set[int] = set()
        self._consumed_queues: set[str] = set()
        self._draining = False
        self._listener: Listener | None = None
        self._keeper: LeaseKeeper | None = None
        self._acks: AckWriter | None = None
        self._checkpointer: WalCheckpointer | None = None
        self._next_reap = 0.0

    def _after_fork_in_child(self) -> None:
        self.store.reset_after_fork()
        self._waiters = LocalWaiters()
        self._nudger = Nudger(self._fetch_listeners, lambda: self._listener.address if self._listener else None)
        self._init_process_state()
        self._schema_lock = threading.Lock()

    def ensure_schema(self) -> None:
        """Create the broker's tables now (otherwise done on first use); refuse a newer schema.

        Raises:
          UnsupportedDatabase: The file holds a schema from a newer broker (the file is untouched).
        """
        self._ready()

    def _ready(self, conn: sqlite3.Connection | None = None) -> None:
        """Create or check the schema once per process, on first use (never at import time).

        With *conn* (a caller's open transaction) the schema is checked and created on it.
        """
        if self._schema_ready and self._schema_pid == os.getpid():
            return
        with self._schema_lock:
            if not (self._schema_ready and self._schema_pid == os.getpid()):
                if conn is None:
                    self.store.schema_ensure()
                else:
                    self.store.schema_ensure_on(conn)
                self._schema_ready, self._schema_pid = True, os.getpid()

    def _ensure_consumer_services(self, queue_name: str) -> None:
        with self._state_lock:
            new_queue = queue_name not in self._consumed_queues
            first_registration = not self._consumed_queues
            self._consumed_queues.add(queue_name)
            if self._acks is None:
                self._checkpointer = WalCheckpointer(self.target.path)
                self._acks = AckWriter(self.store, self.owner, self._on_lost, self._checkpointer.committed)
            if self._listener is None:
                try:
                    self._listener = Listener(self._namespace, self.owner, self._waiters.notify)
                except OSError as e:  # no abstract sockets (non-Linux): rely on bounded waits
                    logger.warning("No wake socket (%s); idle consumers poll every worker timeout.", e)
            if self._keeper is None:
                self._keeper = LeaseKeeper(
                    self.store,
                    self.owner,
                    self.lease_ttl_ms,
                    self._held_ids,
                    self.reap,
                    self.housekeeping,
                    self.reap_interval_s,
                )
        if new_queue:
            now = current_millis()
            with self.store.write() as conn:
                if first_registration:
                    self._report_unclean_exits(conn, now)
                self.store.queue_declare(conn, queue_name, now)
                self.store.process_register(
                    conn,
                    self.owner,
                    socket.gethostname(),
                    os.getpid(),
                    self._listener.address if self._listener else None,
                    ",".join(sorted(self._consumed_queues)),
                    now,
                )

    # -- dramatiq.Broker API -----------------------------------------------------------------------
    def emit_before(self, signal: str, *args: Any, **kwargs: Any) -> None:
        # The broker's own lifecycle hooks run before any middleware and are not middleware: a
        # delivery released at shutdown must be skipped before an actor can start it.
        if signal == "process_message" and args and isinstance(args[0], SQLiteMessageProxy):
            if not self._mark_started(args[0]):
                raise SkipMessage("delivery was released at shutdown; another process runs it")
        elif signal == "worker_shutdown":
            self._release_unstarted()
        super().emit_before(signal, *args, **kwargs)

    def emit_after(self, signal: str, *args: Any, **kwargs: Any) -> None:
        if signal == "worker_boot":
            self._draining = False
        elif signal == "process_boot":
            self._watch_termination()
        super().emit_after(signal, *args, **kwargs)

    def _watch_termination(self) -> None:
        """Give prefetched messages back the moment SIGTERM arrives.

        Dramatiq's CLI notices SIGTERM only in a one-second sleep loop before it stops the Worker;
        other processes would wait that long for the messages this one prefetched. When the process
        already has a Python SIGTERM handler (the CLI's graceful stop), wrap it: ours only puts a token
        on a ``SimpleQueue`` (re-entrant, safe in a signal handler, unlike ``Event.set``), a thread
        releases the unstarted deliveries, and the original handler runs as before. A repeat within
        :data:`REPEATED_SIGTERM_WINDOW_S` is dropped: a signal sent to the whole process group (honcho,
        ``kill -- -PGID``) reaches a worker twice — directly and forwarded by Dramatiq's main process —
        and Dramatiq would take the second one as "kill now". Processes without a handler are left alone.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)
        if not callable(previous) or getattr(previous, "_tenure_wrapped", False):
            return
        tokens: queue.SimpleQueue[float] = queue.SimpleQueue()
        first: list[float] = []

        def release_when_terminating() -> None:
            tokens.get()
            self._release_unstarted()

        threading.Thread(target=release_when_terminating, name="tenure-broker-sigterm", daemon=True).start()

        def on_sigterm(signum: int, frame: Any) -> Any:
            now = time.monotonic()
            if first and now - first[0] < REPEATED_SIGTERM_WINDOW_S:
                return None
            if not first:
                first.append(now)
                tokens.put(now)
            return previous(signum, frame)

        on_sigterm._tenure_wrapped = True  # type: ignore[attr-defined]
        signal.signal(signal.SIGTERM, on_sigterm)

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 30000) -> _SQLiteConsumer:
        if queue_name not in self.queues and queue_name not in self.delay_queues:
            raise QueueNotFound(queue_name)
        self._ready()
        if queue_name in self.queues:
            self._ensure_consumer_services(queue_name)
        return _SQLiteConsumer(self, queue_name, prefetch, timeout)

    def enqueue(self, message: Message, *, delay: int | None = None, connection: Any = None) -> Message:
        """Enqueue a message; with ``delay`` (ms) it becomes visible at ``now + delay``.

        Parameters:
          message: The message (or a proxy of one, as Retries passes).
          delay: Milliseconds before the message may run.
          connection: An open ``sqlite3.Connection`` or SQLAlchemy ``Connection`` on the same
            database file. The row is written inside the caller's transaction (nothing is committed
            here) and consumers are woken once that transaction has committed.

        Returns:
          The message as Dramatiq's other brokers return it: with a delay, a copy on the ``.DQ``
          queue with ``options["eta"]``.

        Raises:
          QueueNotFound: The queue was never declared.
          ConnectionClosed: The database is unavailable.
        """
        enqueued = self._enqueued(message, delay)
        canonical, returned, row = enqueued.queue, enqueued.returned, enqueued.row()
        self.emit_before("enqueue", returned, delay)
        if connection is None:
            self._ready()
            self.store.insert_autocommit(**row)
            self.wake([canonical])
        else:
            raw = _raw_sqlite_connection(connection)
            self._check_same_database(raw)
            # The caller's transaction may already hold the write lock: check or create the schema
            # on that connection instead of opening a second writer that would wait for it.
            self._ready(raw)
            row_id = self.store.message_insert(raw, **row)
            # In this broker's own transaction (the ack writer's, where a claim refills a queue's window) the
            # commit is seen here; a caller's transaction is watched for.
            if not self.store.on_commit(raw, ("wake", canonical), functools.partial(self.wake, (canonical,))):
                _CommitWatcher.get(self).watch(row_id, canonical)
        self.emit_after("enqueue", returned, delay)
        return returned

    def enqueue_many(self, items: Sequence[tuple[Message, int | None]], *, connection: Any) -> list[Message]:
        """:meth:`enqueue` of several ``(message, delay)`` inside the open transaction of *connection*, in order.

        One check of the connection and one ``INSERT`` for them all: a fair-share refill in the ack writer's
        transaction admits a window's worth of jobs at once. In a caller's own transaction each message is
        enqueued alone (the commit watcher follows each row).

        Raises:
          QueueNotFound: A queue was never declared.
          UnsupportedDatabase: *connection* is to another file or is not a SQLite connection.
        """
        raw = _raw_sqlite_connection(connection)
        if not self.store.is_own(raw):
            return [self.enqueue(message, delay=delay, connection=connection) for message, delay in items]
        enqueued = [self._enqueued(message, delay) for message, delay in items]
        for entry, (_, delay) in zip(enqueued, items, strict=True):
            self.emit_before("enqueue", entry.returned, delay)
        self._ready(raw)
        self.store.message_insert_many(raw, [entry.row() for entry in enqueued])
        for canonical in dict.fromkeys(entry.queue for entry in enqueued):
            self.store.on_commit(raw, ("wake", canonical), functools.partial(self.wake, (canonical,)))
        for entry, (_, delay) in zip(enqueued, items, strict=True):
            self.emit_after("enqueue", entry.returned, delay)
        return [entry.returned for entry in enqueued]

    def flush(self, queue_name: str) -> None:
        self._ready()
        with self.store.write() as conn:
            self.store.queue_flush(conn, q_name(queue_name))

    def join(self, queue_name: str, *, timeout: int | None = None) -> None:
        """Wait until *queue_name* has no ready, delayed or leased messages (a test helper).

        Raises:
          QueueJoinTimeout: When ``timeout`` (ms) elapses first.
          QueueNotFound: When the queue was never declared.
        """

        def flush() -> None:
            if self._acks is not None:
                self._acks.flush(5.0)

        def pending(queue: str) -> int:
            self._ready()
            with self.store.read() as conn:
                return self.store.queue_pending_count(conn, queue)

        self._join(queue_name, timeout, flush=flush, pending=pending)

    def close(self) -> None:
        """Stop this process's threads: release unstarted deliveries, commit acks, leave the rest.

        Deliveries still running (a worker past its shutdown timeout) keep their leases until they
        expire, so no other process starts them while this one may still be running them.
        """
        if self._pid != os.getpid():
            return
        self._release_unstarted()
        if self._acks is not None:
            self._acks.stop()
        if self._checkpointer is not None:
            self._checkpointer.stop()
        if self._keeper is not None:
            self._keeper.stop()
        if self._listener is not None:
            self._listener.close()
            try:
                with self.store.write() as conn:
                    self.store.process_unregister(conn, self.owner)
            except Exception:
                logger.debug("Could not unregister %s.", self.owner, exc_info=True)
        _CommitWatcher.stop_for(self)
        self.store.close()
        self._init_process_state()

    # -- operators' API ----------------------------------------------------------------------------
    def stats(self) -> list[QueueStats]:
        """Per-queue counts: ready, delayed, leased, dead, oldest ready age, paused."""
        self._ready()
        with self.store.read() as conn:
            return self.store.queue_stats(conn, current_millis())

    @contextlib.contextmanager
    def _writing(self, connection: Any = None) -> Iterator[sqlite3.Connection]:
        """This broker's own write transaction, or the caller's open one on the same file (*connection*:
        a sqlite3 or SQLAlchemy connection; nothing is committed here)."""
        if connection is None:
            self._ready()
            with self.store.write() as conn:
                yield conn
            return
        raw = _raw_sqlite_connection(connection)
        self._check_same_database(raw)
        self._ready(raw)  # on the caller's connection: its transaction may hold the write lock already
        yield raw

    # The operator calls below take an optional *connection*: an open transaction of the caller's on
    # this broker's file, which the change joins (it commits or rolls back with the caller's own rows,
    # e.g. an audit record). The caller then wakes consumers after its commit (:meth:`wake`).

    def pause(self, queue_name: str, *, connection: Any = None) -> None:
        """Stop claims on a queue (in every process) until :meth:`resume`."""
        self._set_paused(queue_name, True, connection)

    def resume(self, queue_name: str, *, connection: Any = None) -> None:
        self._set_paused(queue_name, False, connection)
        if connection is None:
            self.wake([q_name(queue_name)])

    def _set_paused(self, queue_name: str, paused: bool, connection: Any) -> None:
        with self._writing(connection) as conn:
            self.store.queue_set_paused(conn, q_name(queue_name), paused, current_millis())

    def dead_letters_list(
        self, queue_name: str | None = None, *, limit: int = 100, after_id: int = 0, actor: str | None = None
    ) -> list[DeadLetter]:
        """Dead letters, oldest first, for one queue or all (and one actor or all)."""
        self._ready()
        with self.store.read() as conn:
            return self.store.dead_list(conn, queue_name and q_name(queue_name), limit, after_id, actor)

    def replay_dead(self, queue_name: str, ids: Sequence[int] | None = None, *, connection: Any = None) -> int:
        """Move dead letters of *queue_name* (all, or the given row ids) back to READY."""
        canonical = q_name(queue_name)
        with self._writing(connection) as conn:
            n = self.store.dead_replay(conn, canonical, ids, current_millis())
        if n and connection is None:
            self.wake([canonical])
        return n

    def delete_dead(self, queue_name: str, ids: Sequence[int] | None = None, *, connection: Any = None) -> int:
        """Delete dead letters of *queue_name* (all, or the given row ids) for good; the number deleted."""
        with self._writing(connection) as conn:
            return self.store.dead_delete(conn, q_name(queue_name), ids)

    def dead_letters_match(self, match: DeadMatch, *, limit: int) -> tuple[int, list[int]]:
        """How many dead letters *match* selects, and the row ids of the oldest *limit* of them."""
        self._ready()
        match = self._canonical(match)
        with self.store.read() as conn:
            return self.store.dead_match_count(conn, match), self.store.dead_match_ids(conn, match, limit)

    def replay_dead_matching(self, match: DeadMatch, *, limit: int, connection: Any = None) -> int:
        """Move the oldest *limit* dead letters *match* selects back to READY (any queue); how many moved."""
        with self._writing(connection) as conn:
            queues = self.store.dead_replay_matching(conn, self._canonical(match), limit, current_millis())
        if queues and connection is None:
            self.wake(set(queues))
        return len(queues)

    def purge_dead_matching(self, match: DeadMatch, *, limit: int, connection: Any = None) -> int:
        """Delete the oldest *limit* dead letters *match* selects; how many were deleted."""
        with self._writing(connection) as conn:
            return self.store.dead_delete_matching(conn, self._canonical(match), limit)

    @staticmethod
    def _canonical(match: DeadMatch) -> DeadMatch:
        return dataclasses.replace(match, queue=match.queue and q_name(match.queue))

    def purge_dead(self, older_than_ms: int | None = None) -> int:
        """Delete dead letters older than ``older_than_ms`` (default: the dead-letter TTL)."""
        self._ready()
        ttl = self.dead_message_ttl_ms if older_than_ms is None else older_than_ms
        with self.store.write() as conn:
            return self.store.dead_purge(conn, current_millis() - ttl)

    def processes(self) -> list[dict[str, Any]]:
        """Live consumer processes: owner, host, pid, queues, start, last heartbeat, leased rows."""
        self._ready()
        keys = ("owner", "host", "pid", "queues", "started_at", "heartbeat_at", "leased")
        with self.store.read() as conn:
            return [dict(zip(keys, row, strict=True)) for row in self.store.process_list(conn)]

    def reap(self) -> int:
        """Return expired leases to READY (their messages run again); the number of rows returned."""
        self._ready()
        now = current_millis()
        with self.store.read() as conn:
            if not self.store.lease_expired_count(conn, now):
                return 0  # the common case stays a cheap read: no write lock taken
        with self.store.write() as conn:
            queues = self.store.lease_reap_expired(conn, now)
        if queues:
            self.leases_reclaimed += len(queues)
            logger.warning("Reclaimed %d expired leases; those messages will run again.", len(queues))
            self.wake(set(queues))
        return len(queues)

    def housekeeping(self) -> None:
        """Forget processes that stopped heartbeating and purge dead letters past their TTL."""
        self._ready()
        now = current_millis()
        with self.store.write() as conn:
            self.store.process_reap(conn, now - 3 * self.lease_ttl_ms, now)
            self.store.dead_purge(conn, now - self.dead_message_ttl_ms)

    def _report_unclean_exits(self, conn: sqlite3.Connection, now: int) -> None:
        """At a consumer process's start: report processes that ended without closing the broker."""
        dead = [
            owner for owner, pid in self.store.process_list_on_host(conn, socket.gethostname()) if not _pid_alive(pid)
        ]
        if dead:
            self.store.process_mark_unclean(conn, dead, now)
        count, since = self.store.unclean_report(conn, now)
        if count:
            self.unclean_exits_reported = (count, since)
            logger.warning(
                "%d consumer process(es) ended uncleanly (killed or crashed) since %s; their messages were or "
                "will be redelivered after the lease TTL. See broker.unclean_exits().",
                count,
                time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime((since or now) / 1000)),
            )

    def unclean_exits(self, limit: int = 100) -> list[dict[str, Any]]:
        """Consumer processes that ended without closing the broker, newest first."""
        self._ready()
        keys = ("owner", "host", "pid", "started_at", "last_heartbeat_at", "detected_at", "reported_at")
        with self.store.read() as conn:
            return [dict(zip(keys, row, strict=True)) for row in self.store.unclean_list(conn, limit)]

    def acknowledge_unclean_exits(self, owners: Sequence[str], *, connection: Any = None) -> int:
        """Forget the unclean exits of *owners* (an operator saw them); how many there were."""
        with self._writing(connection) as conn:
            return self.store.unclean_delete(conn, owners)

    def counters(self) -> dict[str, int]:
        """This process's lease counters since start (monotonic; for metrics)."""
        keeper = self._keeper
        return {
            "leases_lost": self.leases_lost,
            "lease_renewals": keeper.renewals if keeper else 0,
            "leases_reclaimed": self.leases_reclaimed,
            "heartbeat_failures": (keeper.failures if keeper else 0) + self.heartbeat_failures,
        }

    def wake(self, queues: Iterable[str]) -> None:
        """Wake consumers of *queues* in this and other processes (after a commit)."""
        queues = list(queues)
        self._waiters.notify(queues)
        self._nudger.nudge(queues)

    # -- internals used by the consumer ------------------------------------------------------------
    def _claim(self, queue: str, slots: PrefetchSlots) -> tuple[list[SQLiteMessageProxy], int | None]:
        now = current_millis()
        with self.store.read() as conn:
            if not self.store.message_ready_probe(conn, queue, now):
                return [], self.store.message_next_eta(conn, queue, now)
        limit = min(slots.free, MAX_CLAIM_BATCH)
        if limit <= 0:
            return [], None
        reaped: list[str] = []
        proxies: list[SQLiteMessageProxy] = []
        poison: list[int] = []
        broken: list[int] = []

        reap = time.monotonic() >= self._next_reap

        def fetch(conn: sqlite3.Connection) -> None:
            nonlocal reaped
            reaped, proxies[:], poison[:], broken[:] = [], [], [], []  # a batch retried runs this again
            if reap:
                reaped = self.store.lease_reap_expired(conn, now)
            for row in self.store.message_claim(conn, queue, self.owner, now, self.lease_ttl_ms, limit):
                if row.deliveries - 1 > self.max_deliveries:
                    poison.append(row.id)
                    continue
                try:
                    message = Message.decode(row.body)
                except DecodeError:
                    broken.append(row.id)
                    continue
                proxies.append(self.proxy_class(message, row.id, row.deliveries, slots, row.eta))
            if poison:
                self.store.message_kill(conn, poison, now, f"poison: redelivered more than {self.max_deliveries} times")
            if broken:
                self.store.message_kill(conn, broken, now, "undecodable message body")

        acks = self._acks
        if acks is not None and acks.running:
            # In the ack writer's next group commit: one writer per process, so a fetch never waits
            # for the write lock behind the acks (and the job layer's claims riding on them) or
            # makes them wait; and the fetch, acks and claims of a moment share one commit.
            acks.run(fetch)
        else:
            with self.store.write() as conn:
                fetch(conn)
        if reap:
            self._next_reap = time.monotonic() + self.reap_interval_s
        for row_id in poison:
            logger.error(
                "Message row %d on %r exceeded %d redeliveries; dead-lettered.", row_id, queue, self.max_deliveries
            )
        for row_id in broken:
            logger.error("Message row %d on %r could not be decoded; dead-lettered.", row_id, queue)
        with self._state_lock:
            for p in proxies:
                self._held[p._row_id] = _Held(p._deliveries, queue)
        slots.take(len(proxies))
        if reaped:
            self.wake(set(reaped))
        return proxies, None

    def write_with_acks(
        self, queue_name: str, fn: Callable[[sqlite3.Connection], T], *, batch: CallBatch | None = None
    ) -> T:
        """Run ``fn(conn)`` in this process's next ack group commit and return its result after the commit.

        For small writes another layer makes for every message it processes, in the same file (a job
        layer's claim): they share the acks' transaction, write lock and commit instead of taking
        their own. *conn* is the broker's sqlite3 connection; *fn* must not commit, may run again if
        the database was unavailable (its first run was rolled back), and if it raises only its own
        writes roll back and the exception is raised here. *batch*: the callers' writes that arrive
        in the same group commit with the same function run as one ``batch(conn, [fn, …])`` (see
        :data:`broker.acks.CallBatch`); *fn* alone is the fallback if that raises.

        Raises:
          ConnectionClosed: The database is unavailable (see :mod:`broker.errors`).
        """
        if self._acks is None:
            self._ready()
            self._ensure_consumer_services(queue_name)
        assert self._acks is not None
        return self._acks.run(fn, batch)  # type: ignore[no-any-return]

    def _settle(self, message: SQLiteMessageProxy, *, dead: bool) -> None:
        with self._state_lock:
            held = self._held.pop(message._row_id, None)
            released = message._row_id in self._released
            self._released.discard(message._row_id)
        message._slots.release()
        self._waiters.notify([message.queue_name])
        hooks = message._ack_hooks
        if released:
            # Given back at shutdown: another process owns it now; only the hooks still run.
            if hooks:
                self._ensure_consumer_services(message.queue_name)
                assert self._acks is not None
                self._acks.submit(
                    Settlement(message._row_id, message._deliveries, message.message_id, hooks=hooks, settle=False)
                )
            return
        del held
        body = None
        reason = ""
        if dead:
            body, reason = dead_letter(message._message, message._exception)
        if self._acks is None:
            self._ensure_consumer_services(message.queue_name)
        assert self._acks is not None
        self._acks.submit(
            Settlement(message._row_id, message._deliveries, message.message_id, dead, body, reason, hooks=hooks)
        )

    def _requeue(self, messages: list[SQLiteMessageProxy], *, quiet: bool = False) -> None:
        leases = []
        with self._state_lock:
            for m in messages:
                self._held.pop(m._row_id, None)
                if m._row_id in self._released:
                    self._released.discard(m._row_id)
                else:
                    leases.append((m._row_id, m._deliveries))
        for m in messages:
            m._slots.release()
        if not leases:
            return
        with self.store.write() as conn:
            n = self.store.lease_release_owner(conn, self.owner, leases)
        if n:
            self.wake({m.queue_name for m in messages})
        if n < len(leases) and not quiet:
            logger.warning(
                "%d of %d requeued messages were no longer leased by this process.", len(leases) - n, len(leases)
            )

    def _mark_started(self, message: SQLiteMessageProxy) -> bool:
        with self._state_lock:
            if message._row_id in self._released:
                return False
            held = self._held.get(message._row_id)
            if held is not None:
                held.started = True
            return True

    def _release_unstarted(self) -> None:
        """Give back every delivery this process holds but has not started (graceful shutdown)."""
        with self._state_lock:
            self._draining = True
            unstarted = [(i, h) for i, h in self._held.items() if not h.started]
            for row_id, _ in unstarted:
                del self._held[row_id]
                self._released.add(row_id)
        if not unstarted:
            return
        try:
            with self.store.write() as conn:
                self.store.lease_release_owner(conn, self.owner, [(i, h.deliveries) for i, h in unstarted])
        except Exception:
            logger.warning(
                "Could not release %d prefetched messages; they return after the lease TTL.",
                len(unstarted),
                exc_info=True,
            )
            return
        logger.info("Released %d prefetched messages for other workers.", len(unstarted))
        self.wake({h.queue for _, h in unstarted})

    def _held_ids(self) -> list[int]:
        with self._state_lock:
            return list(self._held)

    def _on_lost(self, s: Settlement) -> None:
        self.leases_lost += 1
        logger.warning(
            "Lease lost for message %s (row %d, delivery %d): its %s was not applied; another delivery may run it.",
            s.message_id,
            s.row_id,
            s.deliveries,
            "nack" if s.dead else "ack",
        )

    def _fetch_listeners(self) -> list[tuple[str, str]]:
        with self.store.read() as conn:
            return self.store.process_wake_addrs(conn, socket.gethostname(), current_millis() - 3 * self.lease_ttl_ms)

    def on_same_database(self, conn: sqlite3.Connection) -> bool:
        """Whether the raw connection *conn* is connected to this broker's file. The broker's own connections
        are, without asking: a fair-share refill in the ack writer's transaction publishes many messages on one."""
        return self.store.is_own(conn) or same_file(_main_database(conn), self.target.path)

    def _check_same_database(self, conn: sqlite3.Connection) -> None:
        if not self.on_same_database(conn):
            raise UnsupportedDatabase(
                f"transactional enqueue needs a connection to {self.target.path}, got one to {_main_database(conn)!r}"
            )


def _main_database(conn: sqlite3.Connection) -> str:
    """The file of *conn*'s ``main`` database ("" for an in-memory one)."""
    return next((path for _, name, path in conn.execute("PRAGMA database_list").fetchall() if name == "main"), "")


@functools.lru_cache(maxsize=64)
def same_file(a: str, b: str) -> bool:
    """Whether paths *a* and *b* name the same file (after symlinks)."""
    # Asked at every transactional enqueue: realpath's syscalls each time cost 4 % of a draining worker's writer
    # thread (py-spy), and a configured path resolves the same way all along.
    return os.path.realpath(a) == os.path.realpath(b)


def _pid_alive(pid: int) -> bool:
    """Whether a process with *pid* exists on this host (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _raw_sqlite_connection(connection: Any) -> sqlite3.Connection:
    """The sqlite3 connection behind a sqlite3 or SQLAlchemy connection."""
    if isinstance(connection, sqlite3.Connection):
        return connection
    dbapi = getattr(getattr(connection, "connection", None), "driver_connection", None)
    if isinstance(dbapi, sqlite3.Connection):
        return dbapi
    raise UnsupportedDatabase(f"transactional enqueue needs a SQLite connection, got {type(connection).__name__}")


class _CommitWatcher:
    """Wakes consumers once rows written inside a caller's transaction become visible (committed).

    Python's sqlite3 has no commit hook, so one thread per process polls for the pending row ids
    every millisecond while there are any (never when idle) and gives up after a few seconds (the
    transaction rolled back, or the row was already consumed).
    """

    GIVE_UP_S = 5.0
    _by_broker: weakref.WeakKeyDictionary[SQLiteBroker, _CommitWatcher] = weakref.WeakKeyDictionary()
    _lock = threading.Lock()

    def __init__(self, broker: SQLiteBroker) -> None:
        self._broker = weakref.ref(broker)
        self._pending: dict[int, tuple[str, float]] = {}
        self._cond = threading.Condition()
        self._pid = os.getpid()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="tenure-broker-commit-watch", daemon=True)
        self._thread.start()

    @classmethod
    def get(cls, broker: SQLiteBroker) -> _CommitWatcher:
        with cls._lock:
            w = cls._by_broker.get(broker)
            if w is None or w._pid != os.getpid() or w._stopped:
                w = cls._by_broker[broker] = cls(broker)
            return w

    @classmethod
    def stop_for(cls, broker: SQLiteBroker) -> None:
        with cls._lock:
            w = cls._by_broker.pop(broker, None)
        if w is not None:
            with w._cond:
                w._stopped = True
                w._cond.notify_all()
            if w._thread is not threading.current_thread():
                w._thread.join(timeout=2.0)

    def watch(self, row_id: int, queue: str) -> None:
        with self._cond:
            self._pending[row_id] = (queue, time.monotonic())
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                pending = dict(self._pending)
            broker = self._broker()
            if broker is None:
                return
            done, queues = [], set()
            try:
                with broker.store.read() as conn:
                    for row_id, (queue, since) in pending.items():
                        visible = conn.execute("SELECT 1 FROM broker_messages WHERE id = ?", (row_id,)).fetchone()
                        if visible or time.monotonic() - since > self.GIVE_UP_S:
                            done.append(row_id)
                            queues.add(queue)
            except Exception:
                logger.debug("Commit watcher read failed.", exc_info=True)
            if queues:
                broker.wake(queues)
            with self._cond:
                for row_id in done:
                    self._pending.pop(row_id, None)
            del broker
            time.sleep(0.001)


__all__ = ["SQLiteBroker", "DEFAULT_URL"]
