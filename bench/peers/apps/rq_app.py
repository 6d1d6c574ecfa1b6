"""RQ in :mod:`bench.jobs_peers`: ``rq worker-pool -w rq.worker.SimpleWorker`` (or RQ's forking ``Worker``).

``BENCH_PEERS_REDIS_URL`` is the benchmark's own Redis database, ``BENCH_PEERS_QUEUE`` the queue. The producer
calls ``Queue.enqueue`` once per job, with ``result_ttl`` of an hour so that every finished job is still in
RQ's finished registry when the benchmark counts it (RQ's default keeps it 500 s; it costs nothing more).
"""

from __future__ import annotations

import os

from redis import Redis
from rq import Queue

from bench.peers.ledger import started

QUEUE = os.environ.get("BENCH_PEERS_QUEUE", "bench_peers")
RESULT_TTL_S = 3600


def bench_peers_noop(stamp: float = 0.0) -> None:
    started(stamp)


class Producer:
    def __init__(self) -> None:
        self.redis = Redis.from_url(os.environ["BENCH_PEERS_REDIS_URL"])
        self.queue = Queue(QUEUE, connection=self.redis)

    def submit(self, stamp: float) -> str:
        return self.queue.enqueue(bench_peers_noop, stamp, result_ttl=RESULT_TTL_S).id

    def close(self) -> None:
        self.redis.close()


def open_producer() -> Producer:
    return Producer()
