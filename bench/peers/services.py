"""The servers every system of :mod:`bench.jobs_peers` stores its jobs in, and how a round starts clean on them.

* PostgreSQL (``BENCH_POSTGRES_URL``, default ``postgresql://postgres@127.0.0.1:5432/postgres``, an admin
  connection): a fresh database per system and round (:func:`postgres_database`), dropped afterwards with
  ``WITH (FORCE)`` (a worker that somehow survived cannot keep it).
* Redis (``BENCH_PEERS_REDIS_URL``, default ``redis://127.0.0.1:6379/11``): a database number of the benchmark's
  own — the tests use 14 and 15, ``bench.broker_bench`` 13, ``bench.queries_bench`` 12 — flushed before and
  after each system's round (:func:`redis_database`): Celery, RQ and Dramatiq's Redis broker each keep keys of
  their own naming there.
* RabbitMQ (``BENCH_RABBITMQ_URL``, default ``amqp://guest:guest@127.0.0.1:5672/%2F``): queue names unique to
  the run and round; the queue and Dramatiq's delay and dead-letter queues (``.DQ``, ``.XQ``) are deleted after
  the round (:func:`delete_rabbitmq_queues`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pika
import psycopg
import redis
from psycopg import sql

POSTGRES_ADMIN_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_PEERS_REDIS_URL", "redis://127.0.0.1:6379/11")
RABBITMQ_URL = os.environ.get("BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


def postgres_url(database: str) -> str:
    return POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{database}"


def drop_postgres_database(name: str) -> None:
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextlib.contextmanager
def postgres_database(name: str) -> Iterator[str]:
    """A new, empty database *name* for the block; yields its URL and drops it afterwards."""
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield postgres_url(name)
    finally:
        drop_postgres_database(name)


@contextlib.contextmanager
def redis_database() -> Iterator[str]:
    """The benchmark's Redis database, empty for the block and emptied after it; yields its URL."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.flushdb()
        yield REDIS_URL
    finally:
        client.flushdb()
        client.close()


def delete_rabbitmq_queues(names: list[str]) -> None:
    """Delete *names* and their Dramatiq delay/dead-letter queues (absent ones are fine)."""
    conn = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        channel = conn.channel()
        for name in names:
            for queue in (name, f"{name}.DQ", f"{name}.XQ"):
                channel.queue_delete(queue)
    finally:
        conn.close()
