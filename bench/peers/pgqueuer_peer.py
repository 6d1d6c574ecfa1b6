"""pgqueuer (PostgreSQL) in :mod:`bench.jobs_peers`.

Each round: a fresh database, ``pgq install``; per drain, one ``pgq run
bench.peers.apps.pgqueuer_app:create_pgqueuer --max-concurrent-tasks 8 --batch-size 4 --log-level WARNING`` per
worker process (pgqueuer wants at least twice the batch size in concurrent tasks; its other options at their
defaults, e.g. LISTEN/NOTIFY wake-ups). pgqueuer deletes a finished job from its queue
table and logs it: completion is a ``successful`` row in ``pgqueuer_log``; whatever is still in ``pgqueuer``
(queued, picked) or logged with another final status counts against the check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from . import services
from .processes import run_tool
from .system import Counts, Deployment, RoundContext, StoreReader, System, base_env, venv_bin

#: pgqueuer_log statuses that end a job other than successfully.
FAILED_STATUSES = ("exception", "canceled", "deleted", "failed")


class PgqueuerDeployment(Deployment):
    app = "pgqueuer_app"

    def __init__(self, env: dict[str, str], dsn: str) -> None:
        super().__init__(env)
        self.store = StoreReader(dsn)

    def worker_commands(self, processes: int, threads: int) -> list[list[str]]:
        cmd = [
            venv_bin("pgq"),
            "run",
            "bench.peers.apps.pgqueuer_app:create_pgqueuer",
            "--max-concurrent-tasks",
            str(threads),
            "--batch-size",
            str(threads // 2),
            "--log-level",
            "WARNING",
        ]
        return [cmd for _ in range(processes)]

    def counts(self) -> Counts:
        waiting = dict(self.store.rows("SELECT status::text, count(*) FROM pgqueuer GROUP BY status"))
        logged = dict(
            self.store.rows(
                "SELECT status::text, count(*) FROM pgqueuer_log WHERE status::text = ANY(%s) GROUP BY status",
                (["successful", *FAILED_STATUSES],),
            )
        )
        done = logged.pop("successful", 0)
        return Counts(done, {**{f"in queue: {k}": v for k, v in waiting.items()}, **logged})

    def close(self) -> None:
        self.store.close()


class Pgqueuer(System):
    name = "pgqueuer"
    label = "pgqueuer (PostgreSQL)"
    group = "peer"
    postgres = True

    @contextlib.contextmanager
    def deploy(self, rc: RoundContext) -> Iterator[Deployment]:
        with services.postgres_database(rc.database_name(self.name)) as dsn:
            env = base_env(BENCH_PEERS_DSN=dsn, PGDSN=dsn)
            run_tool([venv_bin("pgq"), "install"], env, rc.log, rc.run_id)
            yield PgqueuerDeployment(env, dsn)
