"""Messages a server broker lost, written again from the job store (Redis restarted without persistence, a
queue deleted by hand): the safety net behind the outbox for Redis and RabbitMQ.

The outbox makes sure a job's message reaches the broker once its transaction commits; after that, only the
broker holds it. A queued job whose message the broker no longer has would wait for ever. The job store
knows, per queue, how many messages the broker should hold: one per admitted job (queued, not waiting for
admission: its message is ready or delayed) and one per running job (delivered, not acked yet). The broker's
own counters (:func:`broker.depth.queue_depths`: ready + delayed + in flight) say how many it holds. When it
holds fewer, that many of the queue's admitted jobs lost theirs: the oldest ones admitted at least a job lease
TTL ago (so a message on its way through the outbox is not taken for lost) get a new message, through the
outbox, in one transaction.

The counts are not one snapshot: the broker is read first, then the job store, so a job that finishes in
between lowers the expected count rather than raising it. A message counted lost that was not (a duplicate
delivery already in flight, a race the age filter did not cover) is a duplicate the job's guarded claim
skips. A queue whose broker cannot count its in-flight messages (RabbitMQ without its management API) is
left alone: RabbitMQ keeps durable queues' messages across restarts and redelivers a closed connection's.
"""

from __future__ import annotations

import logging

from dramatiq.broker import Broker
from sqlalchemy import Engine

from broker.depth import queue_depths

from . import admission_store, db, store
from .publish import Publication, in_job_database, publish_in_transaction

logger = logging.getLogger(__name__)


def republish_lost(engine: Engine, broker: Broker, *, min_age_ms: int, now: int | None = None) -> int:
    """Give the admitted jobs of each queue whose messages the broker lost a new message; how many.

    Parameters:
      engine: The job database.
      broker: The deployment's broker (a broker on the job database — SQLite or PostgreSQL — writes
        messages in the jobs' own transactions: nothing to do).
      min_age_ms: Only jobs admitted at least this long ago (the job lease TTL).
      now: Injected clock, for tests.
    """
    depths = {d.queue: d for d in queue_depths(broker)}  # first: see the module docstring
    now = store.now_ms() if now is None else now
    republished = 0
    with db.write(engine) as tx:
        if in_job_database(tx.conn, broker):
            return 0
        for queue, expected in admission_store.messages_expected(tx.conn, store.WORKFLOW_WORKER).items():
            depth = depths.get(queue)
            if depth is None or depth.delayed is None or depth.leased is None:
                continue
            missing = expected - (depth.ready + depth.delayed + depth.leased)
            if missing <= 0:
                continue
            lost = admission_store.admitted_oldest(tx.conn, queue, now - min_age_ms, missing)
            publish_in_transaction(
                tx.conn, broker, [Publication.of(job, delay_ms=job.run_after - now) for job in lost], now=now
            )
            republished += len(lost)
    if republished:
        logger.warning("Republished %d job message(s) the broker no longer held.", republished)
    return republished
