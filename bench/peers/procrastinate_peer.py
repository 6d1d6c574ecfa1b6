"""procrastinate (PostgreSQL) in :mod:`bench.jobs_peers`.

Each round: a fresh database, ``procrastinate schema --apply``; per drain, one ``procrastinate
--app=bench.peers.apps.procrastinate_app.app --log-level warning worker --concurrency 8 --queues <queue>`` per worker
process (listening for NOTIFY, its default);
completion is a ``succeeded`` row in ``procrastinate_jobs`` (the worker keeps finished jobs by default).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from . import services
from .processes import run_tool
from .system import Counts, Deployment, RoundContext, StoreReader, System, base_env, venv_bin

APP = "--app=bench.peers.apps.procrastinate_app.app"


class ProcrastinateDeployment(Deployment):
    app = "procrastinate_app"

    def __init__(self, env: dict[str, str], dsn: str, queue: str) -> None:
        super().__init__(env)
        self.store = StoreReader(dsn)
        self.queue = queue

    def worker_commands(self, processes: int, threads: int) -> list[list[str]]:
        cmd = [venv_bin("procrastinate"), APP, "--log-level", "warning", "worker", "--concurrency", str(threads)]
        cmd += ["--queues", self.queue]
        return [cmd for _ in range(processes)]

    def counts(self) -> Counts:
        rows = dict(self.store.rows("SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY status"))
        return Counts(rows.pop("succeeded", 0), rows)

    def close(self) -> None:
        self.store.close()


class Procrastinate(System):
    name = "procrastinate"
    label = "procrastinate (PostgreSQL)"
    group = "peer"
    postgres = True

    @contextlib.contextmanager
    def deploy(self, rc: RoundContext) -> Iterator[Deployment]:
        with services.postgres_database(rc.database_name(self.name)) as dsn:
            env = base_env(BENCH_PEERS_DSN=dsn, BENCH_PEERS_QUEUE=rc.queue)
            run_tool([venv_bin("procrastinate"), APP, "schema", "--apply"], env, rc.log, rc.run_id)
            yield ProcrastinateDeployment(env, dsn, rc.queue)
