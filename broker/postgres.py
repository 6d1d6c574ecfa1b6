"""PostgresBroker: a Dramatiq broker whose messages are lease rows in a PostgreSQL database.

The fleet's broker when the job records are on PostgreSQL too: a job and its message commit in one
transaction (``enqueue(…, connection=…)``), as on the SQLite default, so no outbox and no relay stand
between a submit and a worker. Consumers on any number of hosts claim batches sized to their free
prefetch with ``FOR UPDATE SKIP LOCKED``; an idle consumer sleeps until a commit wakes it (``NOTIFY``
from a trigger, so a rolled-back enqueue wakes nobody). Delivery is at least once: a process renews the
leases it holds; when it dies its rows become READY again once the lease TTL passes, reclaimed by any
live process. Acks and nacks are fenced by the lease, as in :class:`broker.SQLiteBroker`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import threading
import time
import urllib.parse
import uuid
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from dramatiq.broker import Consumer, MessageProxy
from dramatiq.common import current_millis, q_name
from dramatiq.errors import ConnectionClosed, DecodeError, QueueNotFound
from dramatiq.message import Message
from dramatiq.middleware import Middleware

from . import postgres_store as store
from .consumer import PrefetchSlots
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
from .store import QueueStats
from .wakeup import IDLE_REPROBE_S, LocalWaiters

logger = logging.getLogger(__name__)

#: Upper bound of how long a due delayed message waits for a busy consumer to promote it, in seconds.
PROMOTE_INTERVAL_S = 1.0
#: Settlements committed per ack transaction at most.
ACK_BATCH = 512


class PostgresConnectionLost(ConnectionClosed):
    """The PostgreSQL server could not be reached, or the connection broke (Dramatiq retries)."""


@contextlib.contextmanager
def _translate_errors() -> Iterator[None]:
    try:
        yield
    except psycopg.OperationalError as e:
        raise PostgresConnectionLost(f"PostgreSQL: {e}") from e


@dataclass(frozen=True)
class Target:
    """The database a broker URL names; a transactional enqueue must be on the same one."""

    conninfo: str
    host: str
    port: int
    dbname: str


def parse_postgres_url(url: str) -> Target:
    """``postgresql://`` (also ``postgres://`` and SQLAlchemy's ``postgresql+psycopg://``) to a target."""
    parsed = urllib.parse.urlsplit(url)
    scheme = parsed.scheme.split("+", 1)[0]
    if scheme not in ("postgresql", "postgres"):
        raise ValueError(f"not a PostgreSQL URL: scheme {parsed.scheme!r}")
    conninfo = urllib.parse.urlunsplit(("postgresql", *parsed[1:]))
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    host = str(params.get("host") or "localhost")
    return Target(
        conninfo, host, int(params.get("port") or 5432), str(params.get("dbname") or params.get("user") or "")
    )


def same_database(raw: psycopg.Connection[Any], target: Target) -> bool:
    """Whether the open connection *raw* is to *target*'s database (host names compared as given)."""
    info = raw.info
    host = info.host or "localhost"
    return info.dbname == target.dbname and int(info.port) == target.port and _host(host) == _host(target.host)


def _host(host: str) -> str:
    return "127.0.0.1" if host in ("localhost", "::1") or host.startswith("/") else host


class PostgresMessageProxy(MessageProxy):
    """A delivered message and the lease it came with: row id, delivery number, prefetch slot."""

    def __init__(self, message: Message, row_id: int, deliveries: int, slots: PrefetchSlots, due_at_ms: int) -> None:
        super().__init__(message)
        self._row_id = row_id
        self._deliveries = deliveries
        self._slots = slots
        self.redelivered = deliveries > 1
        #: When the message became due (its eta, or its enqueue time), in ms: queue wait = start - due_at_ms.
        self.due_at_ms = due_at_ms


@dataclass(frozen=True)
class _Settlement:
    row_id: int
    deliveries: int
    message_id: str
    dead: bool = False
    body: bytes | None = None
    reason: str = ""


class PostgresBroker(LeaseBroker):
    """A Dramatiq broker storing messages as leased rows in PostgreSQL (14 or newer).

    Parameters:
      url: ``postgresql://user@host:port/dbname`` (``postgres://`` and ``postgresql+psycopg://`` too).
      middleware: As :class:`dramatiq.Broker`; ``None`` means Dramatiq's default middleware.
      lease_ttl_ms: Lease lifetime without a heartbeat (≥ 1000). Heartbeats run at a third of it.
      max_deliveries: Redeliveries (lease expiries) after which a message is dead-lettered as poison.
      dead_message_ttl_ms: How long dead letters are kept.

    Raises:
      ValueError: Not a PostgreSQL URL, or a lease TTL under one second.
    """

    proxy_class: type[PostgresMessageProxy] = PostgresMessageProxy

    def __init__(
        self,
        url: str,
        middleware: list[Middleware] | None = None,
        *,
        lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS,
        max_deliveries: int = DEFAULT_MAX_DELIVERIES,
        dead_message_ttl_ms: int = DEFAULT_DEAD_MESSAGE_TTL_MS,
        reap_interval_s: float = DEFAULT_REAP_INTERVAL_S,
    ) -> None:
        check_lease_options(lease_ttl_ms, max_deliveries)
        super().__init__(middleware)
        self.queues: set[str] = set()  # type: ignore[assignment]
        self.target = parse_postgres_url(url)
        self.lease_ttl_ms = lease_ttl_ms
        self.max_deliveries = max_deliveries
        self.dead_message_ttl_ms = dead_message_ttl_ms
        self.reap_interval_s = min(reap_interval_s, lease_ttl_ms / 3000)
        self.leases_lost = 0
        self.leases_reclaimed = 0
        self._schema_lock = threading.Lock()
        self._init_process_state()
        after_fork.add(self)

    # -- process-local state (regenerated after fork) ----------------------------------------------
    def _init_process_state(self) -> None:
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._pid = os.getpid()
        self._local = threading.local()
        self._connections: list[psycopg.Connection[Any]] = []
        self._state_lock = threading.Lock()
        #: Row ids this process holds a lease on (claimed, not settled): the ones its heartbeat renews.
        self._held: set[int] = set()
        self._waiters = LocalWaiters()
        self._services: _Services | None = None
        self._schema_ready = False

    def _after_fork_in_child(self) -> None:
        # The parent's connections share their sockets with the child. They are only forgotten, never closed
        # here: psycopg finishes a connection only in the process that opened it, so the parent's sessions live on.
        self._schema_lock = threading.Lock()
        self._init_process_state()

    def _connect(self) -> psycopg.Connection[Any]:
        with _translate_errors():
            conn = psycopg.connect(self.target.conninfo, autocommit=True, application_name="tenure-broker")
        with self._state_lock:
            self._connections.append(conn)
        return conn

    def _conn(self) -> psycopg.Connection[Any]:
        """This thread's autocommit connection (reopened if it broke)."""
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed or conn.broken:
            conn = self._local.conn = self._connect()
        return conn

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[Any]]:
        conn = self._conn()
        with _translate_errors(), conn.transaction():
            yield conn

    def ensure_schema(self) -> None:
        """Create the broker's tables now (otherwise done on first use); refuse a newer schema.

        Raises:
          UnsupportedDatabase: The database holds a schema from a newer broker (nothing is changed).
        """
        self._ready()

    def _ready(self, conn: psycopg.Connection[Any] | None = None) -> None:
        """Check or create the schema once per process, on first use (never at import time)."""
        if self._schema_ready:
            return
        with self._schema_lock:
            if self._schema_ready:
                return
            if conn is None:
                with self._transaction() as tx:
                    self._check_or_create(tx)
            else:
                self._check_or_create(conn)
            self._schema_ready = True

    @staticmethod
    def _check_or_create(conn: psycopg.Connection[Any]) -> None:
        version = store.schema_version(conn)
        if version is None:
            store.schema_create(conn)
        elif version > store.SCHEMA_VERSION:
            raise UnsupportedDatabase(
                f"the database holds broker schema version {version}; this broker knows {store.SCHEMA_VERSION}"
            )

    def _ensure_consumer_services(self) -> _Services:
        with self._state_lock:
            if self._services is None:
                self._services = _Services(self)
            return self._services

    # -- dramatiq.Broker API -----------------------------------------------------------------------
    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 30000) -> _PostgresConsumer:
        if queue_name not in self.queues and queue_name not in self.delay_queues:
            raise QueueNotFound(queue_name)
        self._ready()
        if queue_name in self.queues:
            self._ensure_consumer_services()
        return _PostgresConsumer(self, queue_name, prefetch, timeout)

    def enqueue(self, message: Message, *, delay: int | None = None, connection: Any = None) -> Message:
        """Enqueue a message; with ``delay`` (ms) it becomes visible at ``now + delay``.

        Parameters:
          message: The message (or a proxy of one, as Retries passes).
          delay: Milliseconds before the message may run.
          connection: An open psycopg or SQLAlchemy connection to the same database. The row is written
            inside the caller's transaction (nothing is committed here); consumers wake when it commits.

        Returns:
          The message as Dramatiq's other brokers return it: with a delay, a copy on the ``.DQ``
          queue with ``options["eta"]``.

        Raises:
          QueueNotFound: The queue was never declared.
          UnsupportedDatabase: *connection* is to another database.
          ConnectionClosed: The database is unavailable.
        """
        enqueued = self._enqueued(message, delay)
        returned, row = enqueued.returned, enqueued.row()
        self.emit_before("enqueue", returned, delay)
        if connection is None:
            self._ready()
            with _translate_errors():
                store.message_insert(self._conn(), **row)
            # Committed: this process's consumers wake now instead of after the trigger's NOTIFY has come back
            # through the listener's connection (other processes still wait for it).
            self._waiters.notify([enqueued.queue])
        else:
            raw = self._same_database(connection)
            self._ready(raw)
            store.message_insert(raw, **row)
        self.emit_after("enqueue", returned, delay)
        return returned

    def enqueue_many(self, items: Sequence[tuple[Message, int | None]], *, connection: Any) -> list[Message]:
        """:meth:`enqueue` of several ``(message, delay)`` inside the open transaction of *connection*, in order:
        one check of the connection and one ``INSERT`` for them all (a fair-share refill admits a window's
        worth of jobs at once).

        Raises:
          QueueNotFound: A queue was never declared (before anything is written).
          UnsupportedDatabase: *connection* is to another database.
          ConnectionClosed: The database is unavailable.
        """
        raw = self._same_database(connection)
        enqueued = [self._enqueued(message, delay) for message, delay in items]
        for entry, (_, delay) in zip(enqueued, items, strict=True):
            self.emit_before("enqueue", entry.returned, delay)
        self._ready(raw)
        store.message_insert_many(raw, [entry.row() for entry in enqueued])
        for entry, (_, delay) in zip(enqueued, items, strict=True):
            self.emit_after("enqueue", entry.returned, delay)
        return [entry.returned for entry in enqueued]

    def _same_database(self, connection: Any) -> Any:
        """The raw psycopg connection of *connection*, checked to be to this broker's database.

        Raises:
          UnsupportedDatabase: It is to another database.
        """
        raw = raw_psycopg_connection(connection)
        if not same_database(raw, self.target):
            raise UnsupportedDatabase(
                f"transactional enqueue needs a connection to database {self.target.dbname!r} on "
                f"{self.target.host}:{self.target.port}, got {raw.info.dbname!r} on {raw.info.host}:{raw.info.port}"
            )
        return raw

    def flush(self, queue_name: str) -> None:
        self._ready()
        with self._transaction() as conn:
            store.queue_flush(conn, q_name(queue_name))

    def join(self, queue_name: str, *, timeout: int | None = None) -> None:
        """Wait until *queue_name* has no ready, delayed or leased messages (a test helper).

        Raises:
          QueueJoinTimeout: When ``timeout`` (ms) elapses first.
          QueueNotFound: When the queue was never declared.
        """

        def flush() -> None:
            if self._services is not None:
                self._services.acks.flush()

        def pending(queue: str) -> int:
            self._ready()
            with _translate_errors():
                return store.queue_pending_count(self._conn(), queue)

        self._join(queue_name, timeout, flush=flush, pending=pending)

    def close(self) -> None:
        """Stop this process's threads and commit pending acks. Deliveries still held (a worker past its
        shutdown timeout) keep their leases until they expire, so nobody else starts them meanwhile."""
        if self._pid != os.getpid():
            return
        if self._services is not None:
            self._services.stop()
        with self._state_lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            with contextlib.suppress(Exception):
                conn.close()
        self._init_process_state()

    # -- operators' API ----------------------------------------------------------------------------
    def stats(self) -> list[QueueStats]:
        """Per-queue counts: ready, delayed, leased, dead, oldest ready age."""
        self._ready()
        with _translate_errors():
            return store.queue_stats(self._conn(), current_millis())

    def reap(self) -> int:
        """Return expired leases to READY now (also done every ``reap_interval_s`` by consuming processes)."""
        self._ready()
        with self._transaction() as conn:
            reaped = store.lease_reap_expired(conn, current_millis())
        self.leases_reclaimed += len(reaped)
        return len(reaped)

    def purge_dead(self, older_than_ms: int | None = None) -> int:
        """Delete dead letters older than *older_than_ms* (default: the dead-letter TTL)."""
        self._ready()
        with self._transaction() as conn:
            return store.dead_purge(conn, current_millis() - (older_than_ms or self.dead_message_ttl_ms))

    # -- internals used by the consumer ------------------------------------------------------------
    def _claim(
        self, queue_name: str, slots: PrefetchSlots, conn: psycopg.Connection[Any]
    ) -> list[PostgresMessageProxy]:
        limit = min(slots.free, MAX_CLAIM_BATCH)
        if limit <= 0:
            return []
        now = current_millis()
        proxies: list[PostgresMessageProxy] = []
        poison: list[int] = []
        broken: list[int] = []
        # One autocommit statement: a claim needs no transaction around it (one round trip, not three).
        with _translate_errors():
            for row in store.message_claim(conn, queue_name, self.owner, now, self.lease_ttl_ms, limit):
                if row.deliveries - 1 > self.max_deliveries:
                    poison.append(row.id)
                    continue
                try:
                    message = Message.decode(row.body)
                except DecodeError:
                    broken.append(row.id)
                    continue
                proxies.append(self.proxy_class(message, row.id, row.deliveries, slots, row.eta))
            store.messages_kill(conn, poison, now, f"poison: redelivered more than {self.max_deliveries} times")
            store.messages_kill(conn, broken, now, "undecodable message body")
        for row_id in poison:
            logger.error(
                "Message row %d on %r exceeded %d redeliveries; dead-lettered.", row_id, queue_name, self.max_deliveries
            )
        for row_id in broken:
            logger.error("Message row %d on %r could not be decoded; dead-lettered.", row_id, queue_name)
        with self._state_lock:
            self._held.update(p._row_id for p in proxies)
        slots.take(len(proxies))
        return proxies

    def _settle(self, message: PostgresMessageProxy, *, dead: bool) -> None:
        with self._state_lock:
            self._held.discard(message._row_id)
        message._slots.release()
        self._waiters.notify([message.queue_name])
        body = None
        reason = ""
        if dead:
            body, reason = dead_letter(message._message, message._exception)
        self._ensure_consumer_services().acks.submit(
            _Settlement(message._row_id, message._deliveries, message.message_id, dead, body, reason)
        )

    def _release(self, messages: list[PostgresMessageProxy], *, quiet: bool = False) -> None:
        with self._state_lock:
            leases = [(m._row_id, m._deliveries) for m in messages if m._row_id in self._held]
            self._held.difference_update(row_id for row_id, _ in leases)
        for m in messages:
            m._slots.release()
        if not leases:
            return
        with _translate_errors():
            n = store.messages_release(self._conn(), self.owner, leases)
        if n < len(leases) and not quiet:
            logger.warning(
                "%d of %d requeued messages were no longer leased by this process.", len(leases) - n, len(leases)
            )

    def _held_ids(self) -> list[int]:
        with self._state_lock:
            return list(self._held)


class _PostgresConsumer(Consumer):
    def __init__(self, broker: PostgresBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        self.broker = broker
        self.queue_name = queue_name
        self.timeout_ms = timeout
        self.slots = PrefetchSlots(max(1, prefetch))
        self._buffer: list[PostgresMessageProxy] = []
        self._closed = threading.Event()
        # Delays are native (an eta column on the canonical queue): Dramatiq's Worker still starts a
        # consumer per ".DQ" queue, and these never receive anything.
        self._idle_only = queue_name in broker.delay_queues
        self._conn: psycopg.Connection[Any] | None = None
        self._next_eta: int | None = None
        self._promoted_at = 0.0

    def __next__(self) -> PostgresMessageProxy | None:
        if self._idle_only:
            self._closed.wait(self.timeout_ms / 1000)
            return None
        deadline = time.monotonic() + self.timeout_ms / 1000
        waiters = self.broker._waiters
        while True:
            if self._buffer:
                return self._buffer.pop(0)
            if self._closed.is_set():
                return None
            seen = waiters.generation(self.queue_name)
            if self.slots.free > 0:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = self.broker._connect()
                self._promote_if_due(self._conn)
                claimed = self.broker._claim(self.queue_name, self.slots, self._conn)
                if claimed:
                    self._buffer.extend(claimed)
                    continue
                if self._promote_if_due(self._conn, drained=True):
                    continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            wait = remaining
            if self._next_eta is not None:
                wait = min(wait, max(0.0, (self._next_eta - current_millis()) / 1000))
            # Every commit that makes a row ready notifies (none is coalesced away, unlike the SQLite broker's
            # nudges), and *seen* was read before the claim: a wait that times out missed nothing.
            if not waiters.wait(self.queue_name, seen, wait) and self._next_eta is None and wait == remaining:
                return None

    def _promote_if_due(self, conn: psycopg.Connection[Any], *, drained: bool = False) -> bool:
        """Make due delayed rows READY when one is known to be due, when the queue just ran dry, or at
        least every :data:`PROMOTE_INTERVAL_S`; True when a delayed row may have become READY."""
        now_s = time.monotonic()
        due = self._next_eta is not None and self._next_eta <= current_millis()
        since = now_s - self._promoted_at
        if not (due or (drained and since > IDLE_REPROBE_S) or since > PROMOTE_INTERVAL_S):
            return False
        self._promoted_at = now_s
        now = current_millis()
        with _translate_errors():
            self._next_eta = store.delayed_promote(conn, self.queue_name, now)
        return due

    def ack(self, message: PostgresMessageProxy) -> None:  # type: ignore[override]
        self.broker._settle(message, dead=False)

    def nack(self, message: PostgresMessageProxy) -> None:  # type: ignore[override]
        self.broker._settle(message, dead=True)

    def requeue(self, messages: Iterable[PostgresMessageProxy]) -> None:  # type: ignore[override]
        self.broker._release(list(messages))

    def close(self) -> None:
        self._closed.set()
        buffered, self._buffer = self._buffer, []
        if buffered:
            self.broker._release(buffered, quiet=True)


class _AckWriter:
    """Commits settlements in batches on a thread of its own: the worker threads that ack never wait
    for the database, and the acks of a moment share one commit."""

    def __init__(self, broker: PostgresBroker) -> None:
        self._broker = broker
        self._queue: queue.SimpleQueue[_Settlement | None] = queue.SimpleQueue()
        self._pending = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="tenure-pgbroker-acks", daemon=True)
        self._thread.start()

    def submit(self, settlement: _Settlement) -> None:
        with self._cond:
            self._pending += 1
        self._queue.put(settlement)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every settlement submitted so far is committed (or given up on)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        self.flush(timeout_s)
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < ACK_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                batch.append(item)
            for attempt in range(5):
                try:
                    if conn is None or conn.closed or conn.broken:
                        conn = self._broker._connect()
                    self._commit(conn, batch)
                    break
                except psycopg.OperationalError:
                    logger.warning("Could not commit %d acks (try %d of 5).", len(batch), attempt + 1, exc_info=True)
                    time.sleep(0.2 * (attempt + 1))
            else:
                logger.error("Gave up on %d acks: their messages are delivered again after the lease TTL.", len(batch))
            with self._cond:
                self._pending -= len(batch)
                self._cond.notify_all()

    def _commit(self, conn: psycopg.Connection[Any], batch: list[_Settlement]) -> None:
        owner = self._broker.owner
        now = current_millis()
        acks = [(s.row_id, s.deliveries) for s in batch if not s.dead]
        # Each statement commits alone: an ack or nack whose lease was lost touches nothing either way.
        lost = len(acks) - store.messages_ack(conn, owner, acks)
        for s in batch:
            if s.dead and not store.message_nack(conn, s.row_id, owner, s.deliveries, s.body, now, s.reason):
                lost += 1
        if lost:
            self._broker.leases_lost += lost
            logger.warning("%d settlements found their lease lost (another delivery may run those messages).", lost)


class _Services:
    """A consuming process's threads: the ack writer, the notification listener and the lease keeper."""

    def __init__(self, broker: PostgresBroker) -> None:
        self._broker = weakref.proxy(broker)
        self._stopped = threading.Event()
        self.acks = _AckWriter(broker)
        self._listener = threading.Thread(target=self._listen, name="tenure-pgbroker-listen", daemon=True)
        self._keeper = threading.Thread(target=self._keep, name="tenure-pgbroker-leases", daemon=True)
        self._listener.start()
        self._keeper.start()

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(Exception):
            # An empty notification ends the listener's wait at once (every listener ignores it).
            self._broker._conn().execute("SELECT pg_notify(%s, '')", (store.CHANNEL,))
        self.acks.stop()
        self._keeper.join(5)
        self._listener.join(5)

    def _listen(self) -> None:
        """Wake this process's consumers when a commit made rows of their queue READY or DELAYED."""
        while not self._stopped.is_set():
            try:
                with psycopg.connect(
                    self._broker.target.conninfo, autocommit=True, application_name="tenure-broker-listen"
                ) as conn:
                    conn.execute(f"LISTEN {store.CHANNEL}")
                    # A notification sent before LISTEN took effect would be missed: wake everyone once.
                    self._broker._waiters.notify(self._broker.queues)
                    while not self._stopped.is_set():
                        for notification in conn.notifies(timeout=0.5):
                            if notification.payload:
                                self._broker._waiters.notify([notification.payload])
                            elif self._stopped.is_set():
                                break
            except (psycopg.OperationalError, ReferenceError):
                if self._stopped.wait(1.0):
                    return
                logger.warning("Lost the broker's notification connection; reconnecting.", exc_info=True)

    def _keep(self) -> None:
        """Renew this process's leases every third of the TTL; reclaim expired ones; purge old dead letters."""
        broker = self._broker
        conn: psycopg.Connection[Any] | None = None
        next_renew = next_purge = 0.0
        while not self._stopped.wait(broker.reap_interval_s):
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = broker._connect()
                now_s = time.monotonic()
                now = current_millis()
                if now_s >= next_renew:
                    store.lease_extend(conn, broker.owner, broker._held_ids(), now, broker.lease_ttl_ms)
                    next_renew = now_s + broker.lease_ttl_ms / 3000
                reaped = store.lease_reap_expired(conn, now)
                if reaped:
                    broker.leases_reclaimed += len(reaped)
                    logger.warning("Reclaimed %d expired leases (a consumer stopped renewing them).", len(reaped))
                if now_s >= next_purge:
                    store.dead_purge(conn, now - broker.dead_message_ttl_ms)
                    next_purge = now_s + 60
            except psycopg.OperationalError:
                logger.warning("Lease keeper could not reach PostgreSQL; retrying.", exc_info=True)
            except ReferenceError:
                return


def raw_psycopg_connection(connection: Any) -> psycopg.Connection[Any]:
    """The psycopg connection behind *connection* (a psycopg or SQLAlchemy connection)."""
    if isinstance(connection, psycopg.Connection):
        return connection
    driver = getattr(getattr(connection, "connection", None), "driver_connection", None)
    if isinstance(driver, psycopg.Connection):
        return driver
    raise TypeError(f"expected a psycopg or SQLAlchemy (psycopg) connection, got {type(connection).__name__}")


__all__ = ["PostgresBroker", "PostgresConnectionLost", "PostgresMessageProxy", "parse_postgres_url", "same_database"]
