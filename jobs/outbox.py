"""The outbox relay: publishes messages that job transactions wrote to ``outbox`` (non-SQLite brokers).

At least once: rows are published while row-locked (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so
relays can run side by side), then marked published in the same transaction. A crash between the
publish and the commit publishes the row again later with the same message id; the job's guarded
claim turns that duplicate delivery into a no-op.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from dramatiq.broker import Broker
from dramatiq.common import dq_name
from dramatiq.message import Message
from sqlalchemy import Engine

from settings.environment import Settings

from . import db, store
from .errors import public_error
from .publish import resolve_broker

logger = logging.getLogger(__name__)

#: Rows published per transaction.
RELAY_BATCH = 200
#: How often a relay waiting for a notification looks whether it was asked to stop, in seconds.
STOP_CHECK_S = 0.5
#: Published rows are kept this long (for audit), in milliseconds.
PUBLISHED_RETENTION_MS = 24 * 3600 * 1000


def relay_once(engine: Engine, broker: Broker | None = None, *, limit: int = RELAY_BATCH) -> int:
    """Publish up to *limit* pending outbox rows; returns how many were published.

    Parameters:
      engine: The job database.
      broker: Where to publish (default: Dramatiq's global broker).
      limit: Batch size.

    Raises:
      sqlalchemy.exc.OperationalError: The database is unavailable (nothing was marked).
    """
    broker = resolve_broker(broker)
    published: list[int] = []
    with db.write(engine) as tx:
        now = store.now_ms()
        for row in store.outbox_pending(tx.conn, limit):
            try:
                message = Message.decode(row.body)
                if message.queue_name not in broker.queues and dq_name(message.queue_name) not in broker.queues:
                    broker.declare_queue(message.queue_name)
                delay = row.eta - now
                broker.enqueue(message, delay=delay if delay > 0 else None)
            except Exception as e:
                logger.warning("Outbox row %d (message %s) not published: %s", row.id, row.message_id, e)
                store.outbox_mark_failed(tx.conn, row.id, public_error(e))
                continue
            published.append(row.id)
        store.outbox_mark_published(tx.conn, published, now)
    return len(published)


def relay_forever(settings: Settings, broker: Broker | None = None, *, stop: threading.Event | None = None) -> None:
    """Run the relay until *stop* is set: publish, prune old rows, sleep when idle.

    Raises:
      SchemaMismatch: The database is not at this code's schema revision (checked first, read-only).
    """
    from .schema import check_database_at_head

    engine = db.make_engine(settings.database_url, busy_timeout_ms=settings.sqlite_busy_timeout_ms)
    check_database_at_head(engine)
    stop = stop or threading.Event()
    next_prune = 0.0
    waker = _Waker(engine)
    logger.info("Outbox relay started.")
    while not stop.is_set():
        try:
            n = relay_once(engine, broker)
            if time.monotonic() >= next_prune:
                next_prune = time.monotonic() + 3600
                with db.write(engine) as tx:
                    store.outbox_prune(tx.conn, store.now_ms() - PUBLISHED_RETENTION_MS)
        except Exception:
            logger.exception("Outbox relay iteration failed; retrying.")
            n = 0
        if n < RELAY_BATCH:
            waker.wait(settings.relay_interval_s, stop)
    waker.close()
    engine.dispose()


class _Waker:
    """How an idle relay waits: on PostgreSQL until a transaction that wrote outbox rows commits (their
    trigger's NOTIFY on :data:`jobs.store.OUTBOX_CHANNEL`) or the poll interval passes; elsewhere the
    interval. A lost listening connection falls back to the interval and listens again next time."""

    def __init__(self, engine: Engine) -> None:
        self._url = engine.url if engine.dialect.name == "postgresql" else None
        self._conn: Any = None

    def wait(self, timeout_s: float, stop: threading.Event) -> None:
        if self._url is None:
            stop.wait(timeout_s)
            return
        deadline = time.monotonic() + timeout_s
        try:
            conn = self._listening()
            # In slices, so a stop is seen within one.
            while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
                if list(conn.notifies(timeout=min(left, STOP_CHECK_S), stop_after=1)):
                    return
        except Exception:
            logger.warning("The outbox relay's LISTEN connection failed; polling until it is back.", exc_info=True)
            self.close()
            stop.wait(timeout_s)

    def _listening(self) -> Any:
        if self._conn is None:
            import psycopg

            url = self._url.set(drivername="postgresql")
            self._conn = psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)
            self._conn.execute(f"LISTEN {store.OUTBOX_CHANNEL}")
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
