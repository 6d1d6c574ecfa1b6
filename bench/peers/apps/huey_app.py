"""huey in :mod:`bench.jobs_peers`: ``huey_consumer bench.peers.apps.huey_app.huey -w 8 -k thread``.

``SqliteHuey`` on the file ``BENCH_PEERS_SQLITE`` (huey's SQLite storage; a task is deleted from its queue table
when a consumer takes it: no lease). huey keeps no trace of a finished task unless it returns a value, so the job
returns 1: its result row is its completion in huey's store. The producer calls the task once per job.
"""

from __future__ import annotations

import os

from huey import SqliteHuey

from bench.peers.ledger import started

huey = SqliteHuey("bench_peers", filename=os.environ["BENCH_PEERS_SQLITE"])


@huey.task()
def bench_peers_noop(stamp: float = 0.0) -> int:
    started(stamp)
    return 1


class Producer:
    def submit(self, stamp: float) -> str:
        return bench_peers_noop(stamp).id

    def close(self) -> None:
        huey.storage.close()


def open_producer() -> Producer:
    return Producer()
