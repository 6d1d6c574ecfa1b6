"""huey with its SQLite storage in :mod:`bench.jobs_peers`.

Each round: a fresh SQLite file in the round's directory (huey creates its tables); per drain, one
``huey_consumer bench.peers.apps.huey_app.huey -w 8 -k thread -q`` per worker process (polling at huey's default
intervals). Completion is the task's result row in ``kv`` (the job returns 1: huey records nothing for a task
that returns None); tasks still in ``task`` or ``schedule`` count against the check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from .system import Counts, Deployment, RoundContext, StoreReader, System, base_env, venv_bin

HUEY_NAME = "bench_peers"


class HueyDeployment(Deployment):
    app = "huey_app"

    def __init__(self, env: dict[str, str], path: Path) -> None:
        super().__init__(env)
        self.store = StoreReader(f"sqlite:///{path}")

    def worker_commands(self, processes: int, threads: int) -> list[list[str]]:
        cmd = [venv_bin("huey_consumer"), "bench.peers.apps.huey_app.huey", "-w", str(threads), "-k", "thread", "-q"]
        return [cmd for _ in range(processes)]

    def counts(self) -> Counts:
        def count(table: str) -> int:
            return self.store.rows(f"SELECT count(*) FROM {table} WHERE queue = %s", (HUEY_NAME,))[0][0]

        return Counts(count("kv"), {"queued": count("task"), "scheduled": count("schedule")})

    def close(self) -> None:
        self.store.close()


class Huey(System):
    name = "huey"
    label = "huey (SQLite, no leases)"
    group = "peer"

    @contextlib.contextmanager
    def deploy(self, rc: RoundContext) -> Iterator[Deployment]:
        path = rc.workdir / "huey.db"
        yield HueyDeployment(base_env(BENCH_PEERS_SQLITE=str(path)), path)
