"""Celery in :mod:`bench.jobs_peers`: ``celery -A bench.peers.apps.celery_app worker -P threads -c 8``.

Redis is both the broker and the result backend (``BENCH_PEERS_REDIS_URL``, the benchmark's own Redis
database); ``BENCH_PEERS_QUEUE`` is the queue. Results are kept (Celery's default): a job's ``SUCCESS`` row in
the result backend is its completion in Celery's own store. The producer calls ``task.delay`` once per job.
"""

from __future__ import annotations

import os

from celery import Celery

from bench.peers.ledger import started

QUEUE = os.environ.get("BENCH_PEERS_QUEUE", "bench_peers")
_url = os.environ["BENCH_PEERS_REDIS_URL"]

app = Celery("bench_peers", broker=_url, backend=_url)
app.conf.update(task_default_queue=QUEUE, broker_connection_retry_on_startup=True)


@app.task(name="bench_peers_noop")
def bench_peers_noop(stamp: float = 0.0) -> None:
    started(stamp)


class Producer:
    def submit(self, stamp: float) -> str:
        return bench_peers_noop.delay(stamp).id

    def close(self) -> None:
        app.close()


def open_producer() -> Producer:
    return Producer()
