"""Celery with Redis as broker and result backend in :mod:`bench.jobs_peers`.

Each round: the benchmark's Redis database, empty; per drain, one ``celery -A bench.peers.apps.celery_app worker
-P threads -c 8 -Q <queue> -n bench<i>@%h`` per worker process (a node name each; Celery's other options at their
defaults). Completion is a ``SUCCESS`` result (``celery-task-meta-<id>``) for every id the producer got back, read
with ``MGET``; an id without a result counts as ``missing``.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator

import redis

from . import services
from .system import Counts, Deployment, RoundContext, System, base_env, venv_bin

CHUNK = 1000


class CeleryDeployment(Deployment):
    app = "celery_app"

    def __init__(self, env: dict[str, str], url: str, queue: str) -> None:
        super().__init__(env)
        self.client = redis.Redis.from_url(url)
        self.queue = queue
        self.ids: list[str] = []
        self._succeeded: set[str] = set()

    def worker_commands(self, processes: int, threads: int) -> list[list[str]]:
        return [
            [venv_bin("celery"), "-A", "bench.peers.apps.celery_app", "worker", "-P", "threads", "-c", str(threads)]
            + ["-Q", self.queue, "-n", f"bench{i}@%h", "--loglevel", "WARNING"]
            for i in range(processes)
        ]

    def submitted(self, ids: list[str]) -> None:
        self.ids.extend(ids)

    def counts(self) -> Counts:
        # A SUCCESS result is final: only the ids not yet seen succeeded are read again.
        todo = [i for i in self.ids if i not in self._succeeded]
        states: Counter[str] = Counter()
        for k in range(0, len(todo), CHUNK):
            chunk = todo[k : k + CHUNK]
            for job_id, raw in zip(chunk, self.client.mget([f"celery-task-meta-{i}" for i in chunk]), strict=True):
                status = "missing" if raw is None else json.loads(raw)["status"]
                if status == "SUCCESS":
                    self._succeeded.add(job_id)
                else:
                    states[status] += 1
        return Counts(len(self._succeeded), dict(states))

    def close(self) -> None:
        self.client.close()


class Celery(System):
    name = "celery"
    label = "Celery + Redis results"
    group = "peer"

    @contextlib.contextmanager
    def deploy(self, rc: RoundContext) -> Iterator[Deployment]:
        with services.redis_database() as url:
            d = CeleryDeployment(base_env(BENCH_PEERS_REDIS_URL=url, BENCH_PEERS_QUEUE=rc.queue), url, rc.queue)
            try:
                yield d
            finally:
                d.close()
