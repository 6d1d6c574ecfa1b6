"""Getting a job's message to the broker in the same transaction as the job's status change.

When the broker keeps its messages in the job database — :class:`broker.SQLiteBroker` on the same
file, :class:`broker.postgres.PostgresBroker` on the same PostgreSQL database — the message row is
inserted inside the job transaction (``broker.enqueue(…, connection=conn)``): the job and its message
commit or roll back together. With Redis or RabbitMQ the transaction writes an ``outbox`` row instead
and :mod:`jobs.outbox` publishes it after commit (at least once; the message id is fixed when the row
is written, so a re-publish is a duplicate delivery the guarded claim ignores).
"""

from __future__ import annotations

import sqlite3
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dramatiq.broker import Broker
from dramatiq.message import Message
from sqlalchemy import Connection

from broker import SQLiteBroker, same_file

from . import store, tracing
from .registry import ACTOR_TIME_LIMIT_MS

#: Message option carrying the job id (how the middleware recognises a job message).
JOB_ID_OPTION = "tenure_job_id"
#: Message option of a limited job: ``[concurrency key, rate key]`` (its claim checks them; jobs.admission).
LIMITS_OPTION = "tenure_limits"


def job_message(
    job_id: str,
    actor_name: str,
    queue_name: str,
    *,
    priority: int = 0,
    message_id: str | None = None,
    trace_context: str | None = None,
    limits: tuple[str | None, str | None] = (None, None),
    ahead: bool = False,
) -> Message:
    """The Dramatiq message that runs *job_id* (no arguments: the job row holds the payload).

    ``broker_priority`` orders the SQLite broker's claims (higher first); other brokers ignore it. When
    tracing, the current span's trace context rides along (:data:`jobs.tracing.TRACE_OPTION`), else the
    job's stored *trace_context* (``jobs.trace_context``). *limits*: the job's concurrency and rate keys,
    which its claim checks (:func:`jobs.admission.claim_refusal`). *ahead*: the job's owner is behind its
    fair share, so it goes before the queue's other ready jobs of the same priority (``broker_priority``
    is twice the job's priority, plus one for such a job).
    """
    options: dict[str, Any] = {JOB_ID_OPTION: job_id, "max_retries": 0, "time_limit": ACTOR_TIME_LIMIT_MS}
    if priority or ahead:
        options["broker_priority"] = 2 * priority + int(ahead)
    if limits != (None, None):
        options[LIMITS_OPTION] = list(limits)
    trace = tracing.carrier(trace_context)
    if trace is not None:
        options[tracing.TRACE_OPTION] = trace
    return Message(
        queue_name=queue_name,
        actor_name=actor_name,
        args=(),
        kwargs={},
        options=options,
        message_id=message_id or str(uuid.uuid4()),
    )


def same_sqlite_file(conn: Connection | sqlite3.Connection, broker: Broker) -> bool:
    """Whether *broker* stores its messages in the SQLite file *conn* is connected to (a SQLAlchemy
    connection, or a raw one of the claim path)."""
    if not isinstance(broker, SQLiteBroker):
        return False
    if isinstance(conn, sqlite3.Connection):
        return broker.on_same_database(conn)
    if conn.dialect.name != "sqlite":
        return False
    database = conn.engine.url.database
    return bool(database) and same_file(database, broker.target.path)


def _postgres_broker(broker: Broker) -> Any:
    """*broker* if it is a :class:`broker.postgres.PostgresBroker`, else None. psycopg is optional (a SQLite
    deployment never installs it): a process that never imported the module cannot have built one."""
    module = sys.modules.get("broker.postgres")
    return broker if module is not None and isinstance(broker, module.PostgresBroker) else None


def same_postgres_database(conn: Connection | sqlite3.Connection, broker: Broker) -> bool:
    """Whether *broker* is the PostgreSQL broker on the database *conn* is connected to."""
    if _postgres_broker(broker) is None or isinstance(conn, sqlite3.Connection):
        return False
    if conn.dialect.name != "postgresql":
        return False
    from broker.postgres import raw_psycopg_connection, same_database

    return same_database(raw_psycopg_connection(conn), broker.target)  # type: ignore[attr-defined]


def in_job_database(conn: Connection | sqlite3.Connection, broker: Broker) -> bool:
    """Whether *broker* writes its messages in the job database *conn* is connected to, so that a message
    can join the job's own transaction."""
    return same_sqlite_file(conn, broker) or same_postgres_database(conn, broker)


@dataclass(frozen=True, slots=True)
class Publication:
    """A queued job's next message, to write: what :func:`job_message` needs, and its delay in milliseconds."""

    job_id: str
    actor_name: str
    queue_name: str
    priority: int
    delay_ms: int
    trace_context: str | None
    limits: tuple[str | None, str | None]
    ahead: bool

    @classmethod
    def of(cls, job: Any, *, delay_ms: int, ahead: bool = False) -> Publication:
        """For a queued job (a :class:`jobs.admission_store.HeldJob`, or any with its attributes)."""
        return cls(
            job.id,
            job.actor_name,
            job.queue_name,
            job.priority,
            max(0, delay_ms),
            job.trace_context,
            (job.concurrency_key, job.rate_key),
            ahead,
        )


def publish_in_transaction(
    conn: Connection | sqlite3.Connection, broker: Broker, jobs: Sequence[Publication], *, now: int
) -> None:
    """Write the next message of each of *jobs*, in order, inside the open transaction of *conn*.

    :mod:`jobs.admission` calls this when it decides a queued job may have its message, and
    :mod:`jobs.redelivery` for admitted jobs whose messages a server broker lost. Several jobs
    (a window refill) are one ``INSERT``. A publication's *trace_context* is the job's stored one, for a
    message written outside any span.

    Raises:
      dramatiq.errors.QueueNotFound: The SQLite or PostgreSQL broker has not declared a queue (call
        :func:`prepare_broker` before opening the transaction).
    """
    if not jobs:
        return
    messages = [
        (
            job_message(
                job.job_id,
                job.actor_name,
                job.queue_name,
                priority=job.priority,
                trace_context=job.trace_context,
                limits=job.limits,
                ahead=job.ahead,
            ),
            job,
        )
        for job in jobs
    ]
    if in_job_database(conn, broker):
        broker.enqueue_many(  # type: ignore[attr-defined]
            [(message, job.delay_ms if job.delay_ms > 0 else None) for message, job in messages], connection=conn
        )
    else:
        store.outbox_insert_many(
            conn,
            [
                store.OutboxEntry(
                    message_id=message.message_id,
                    job_id=job.job_id,
                    queue_name=job.queue_name,
                    actor_name=job.actor_name,
                    body=message.encode(),
                    eta=now + max(0, job.delay_ms),
                )
                for message, job in messages
            ],
            now=now,
        )


def resolve_broker(broker: Any | None) -> Broker:
    import dramatiq

    return broker if broker is not None else dramatiq.get_broker()


def prepare_broker(broker: Broker, queue_name: str | None = None) -> None:
    """Get *broker* ready for a transactional enqueue BEFORE the caller's transaction opens.

    The SQLite broker checks its schema on first use in a process with its own write transaction;
    inside ours (which holds SQLite's write lock) that would wait for ourselves until the busy
    timeout. So the check is forced here, outside any transaction (the PostgreSQL broker's too: a
    schema created inside the caller's transaction would roll back with it).
    """
    if isinstance(broker, SQLiteBroker) or _postgres_broker(broker) is not None:
        if queue_name is not None:
            broker.declare_queue(queue_name)
        broker._ready()  # type: ignore[attr-defined]
