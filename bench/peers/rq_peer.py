"""RQ (Redis) in :mod:`bench.jobs_peers`, with ``SimpleWorker`` (jobs run in the worker process) and with its
default ``Worker`` (a forked work-horse per job).

An RQ worker runs one job at a time, so "8 threads" is RQ's own pool of 8 worker processes: one ``rq worker-pool
-w <class> -n 8 -u <redis> -l WARNING <queue>`` per "worker process" of the other systems (2 × 8 = two pools, 16 RQ
workers). The gate waits for all of them to hold a job. Completion: the job in RQ's ``FinishedJobRegistry``;
the queue, the started and the failed registries must be empty.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from redis import Redis
from rq import Queue
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry

from . import services
from .system import Counts, Deployment, RoundContext, System, base_env, venv_bin


class RqDeployment(Deployment):
    app = "rq_app"

    def __init__(self, env: dict[str, str], url: str, queue: str, worker_class: str) -> None:
        super().__init__(env)
        self.url = url
        self.queue_name = queue
        self.worker_class = worker_class
        self.redis = Redis.from_url(url)

    def worker_commands(self, processes: int, threads: int) -> list[list[str]]:
        cmd = [venv_bin("rq"), "worker-pool", "-w", self.worker_class, "-n", str(threads), "-u", self.url]
        cmd += ["-l", "WARNING"]
        return [[*cmd, self.queue_name] for _ in range(processes)]

    def workers_started(self, processes: int, threads: int) -> int:
        return processes * threads

    def counts(self) -> Counts:
        queue = Queue(self.queue_name, connection=self.redis)
        return Counts(
            FinishedJobRegistry(queue=queue).count,
            {
                "queued": queue.count,
                "started": StartedJobRegistry(queue=queue).count,
                "failed": FailedJobRegistry(queue=queue).count,
            },
        )

    def close(self) -> None:
        self.redis.close()


class Rq(System):
    group = "peer"

    def __init__(self, name: str, label: str, worker_class: str, fork: bool) -> None:
        self.name = name
        self.label = label
        self.worker_class = worker_class
        self.fork = fork

    @contextlib.contextmanager
    def deploy(self, rc: RoundContext) -> Iterator[Deployment]:
        with services.redis_database() as url:
            env = base_env(BENCH_PEERS_REDIS_URL=url, BENCH_PEERS_QUEUE=rc.queue)
            if self.fork:
                env["BENCH_LEDGER_KEY"] = "ppid"  # the work-horse records under its worker's key
            d = RqDeployment(env, url, rc.queue, self.worker_class)
            try:
                yield d
            finally:
                d.close()


SIMPLE = Rq("rq-simple", "RQ SimpleWorker (Redis)", "rq.worker.SimpleWorker", fork=False)
FORK = Rq("rq-fork", "RQ fork-per-job (Redis)", "rq.worker.Worker", fork=True)
