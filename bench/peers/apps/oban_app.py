"""Oban for Python in :mod:`bench.jobs_peers`: ``oban start --cron-modules bench.peers.apps.oban_app``.

Runs on Python 3.12 in the virtualenv :mod:`bench.peers.oban` makes (Oban needs 3.12), so it imports only
``oban`` and the standard library. ``BENCH_PEERS_DSN`` is the system's fresh PostgreSQL database,
``BENCH_PEERS_QUEUE`` its queue. ``oban start`` imports this module at boot (``--cron-modules``: it also keeps
Oban from grepping the working directory for cron workers) and resolves the job's worker by its path. The
producer is an Oban instance in client mode (no queues) enqueuing one job per call (``Worker.enqueue``).
"""

from __future__ import annotations

import os
from typing import Any

from oban import Oban, worker

from bench.peers.ledger import started

QUEUE = os.environ.get("BENCH_PEERS_QUEUE", "bench_peers")


@worker(queue=QUEUE)
class BenchPeersNoop:
    async def process(self, job: Any) -> None:
        started(job.args.get("stamp", 0.0))


class Producer:
    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.oban = Oban(pool=pool)

    async def submit(self, stamp: float) -> int:
        job = await BenchPeersNoop.enqueue({"stamp": stamp})
        return job.id

    async def close(self) -> None:
        await self.pool.close()


async def open_async_producer() -> Producer:
    return Producer(await Oban.create_pool(os.environ["BENCH_PEERS_DSN"]))
