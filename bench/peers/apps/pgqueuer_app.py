"""pgqueuer in :mod:`bench.jobs_peers`: ``pgq run bench.peers.apps.pgqueuer_app:create_pgqueuer``.

``BENCH_PEERS_DSN`` is the system's fresh PostgreSQL database. The entrypoint is an ``async def`` no-op; the
producer enqueues with pgqueuer's synchronous ``SyncQueries.enqueue``, one job per call, on one autocommit
psycopg connection (pgqueuer requires autocommit).
"""

from __future__ import annotations

import os
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
from pgqueuer import Job, PgQueuer
from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
from pgqueuer.db import PsycopgDriver
from pgqueuer.queries import SyncQueries

from bench.peers.ledger import started

ENTRYPOINT = "bench_peers_noop"
STAMP = struct.Struct("<d")


def _dsn() -> str:
    return os.environ["BENCH_PEERS_DSN"]


@asynccontextmanager
async def create_pgqueuer() -> AsyncIterator[PgQueuer]:
    """The factory ``pgq run`` calls."""
    conn = await psycopg.AsyncConnection.connect(_dsn(), autocommit=True)
    pgq = PgQueuer(PsycopgDriver(conn))

    @pgq.entrypoint(ENTRYPOINT)
    async def bench_peers_noop(job: Job) -> None:
        started(STAMP.unpack(job.payload)[0] if job.payload else 0.0)

    try:
        yield pgq
    finally:
        await conn.close()


class Producer:
    def __init__(self) -> None:
        self.conn = psycopg.connect(_dsn(), autocommit=True)
        self.queries = SyncQueries(SyncPsycopgDriver(self.conn))

    def submit(self, stamp: float) -> int:
        return self.queries.enqueue(ENTRYPOINT, STAMP.pack(stamp))[0]

    def close(self) -> None:
        self.conn.close()


def open_producer() -> Producer:
    return Producer()
