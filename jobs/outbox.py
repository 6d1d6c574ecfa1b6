"""The outbox relay: publishes messages that job transactions wrote to ``outbox`` (non-SQLite brokers).

At least once: rows are published while row-locked (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so
relays can run side by side), then marked published in the same transaction. A crash between the
publish and the commit publishes the row again later with the same message id; the job's guarded
claim turns that duplicate delivery into a no-op.
"""

from __future__ import annotations

import logging
import threading
import time

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
    published = 0
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
            store.outbox_mark_published(tx.conn, row.id, now)
            published += 1
    return published


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
            stop.wait(settings.relay_interval_s)
    engine.dispose()
