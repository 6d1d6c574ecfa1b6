"""procrastinate in :mod:`bench.jobs_peers`: ``procrastinate --app=bench.peers.apps.procrastinate_app.app worker``.

``BENCH_PEERS_DSN`` is the system's fresh PostgreSQL database, ``BENCH_PEERS_QUEUE`` its queue. The job is an
``async def`` no-op (procrastinate's native form); the producer defers synchronously (``task.defer``), one job
per call.
"""

from __future__ import annotations

import os

import procrastinate

from bench.peers.ledger import started

QUEUE = os.environ.get("BENCH_PEERS_QUEUE", "bench_peers")

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ["BENCH_PEERS_DSN"]))


@app.task(name="bench_peers_noop", queue=QUEUE)
async def bench_peers_noop(stamp: float = 0.0) -> None:
    started(stamp)


class Producer:
    def __init__(self) -> None:
        app.open()

    def submit(self, stamp: float) -> int:
        return bench_peers_noop.defer(stamp=stamp)

    def close(self) -> None:
        app.close()


def open_producer() -> Producer:
    return Producer()
