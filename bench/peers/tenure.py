"""Tenure's deployments in :mod:`bench.jobs_peers`, one row of :data:`VARIANTS` each.

A variant names its job database and broker as templates filled in per round — ``{sqlite}``: a fresh file in the
round's directory; ``{postgresql}``: a fresh PostgreSQL database; ``{redis}``: the benchmark's Redis database;
``{amqp}``: RabbitMQ (the round's queue names are unique); an empty broker URL is the default deployment's SQLite
broker on the job file, and ``{postgresql}`` as the broker the PostgreSQL broker on the job database — and says
whether ``tenure relay`` runs beside the workers (as ``Procfile.fleet`` runs it, for the whole round).
``env`` is added to every Tenure process's environment (worker, relay, producer) and
``kind_options`` to the benchmark kind's declaration (:mod:`bench.peers.apps.tenure_app`): the hooks a variant
with other settings (fairness, concurrency limits, another fleet path) needs, without touching the peers.

Each round: ``tenure db upgrade``; the relay if the variant has one; ``tenure worker
bench.peers.apps.tenure_app:compose --processes P --threads 8 --queues <queue>`` per drain; completion is a
``succeeded`` row in ``jobs``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import services
from .processes import Launched, run_tool
from .system import Counts, Deployment, Group, RoundContext, StoreReader, System, base_env, venv_bin

APP = "bench.peers.apps.tenure_app:compose"


@dataclass(frozen=True)
class TenureVariant:
    name: str
    label: str
    group: Group
    database_url: str
    broker_url: str
    relay: bool
    env: Mapping[str, str] = field(default_factory=dict)
    kind_options: Mapping[str, Any] = field(default_factory=dict)


#: Fairness is on by default; every variant also declares a per-owner concurrency limit (issue 17 measures
#: Tenure "with fairness and limits switched on"), one that never binds, so it costs its admission work only.
LIMITS_ON = {"BENCH_TENURE_OWNER_LIMIT": "1000"}

VARIANTS: tuple[TenureVariant, ...] = (
    TenureVariant(
        "tenure-sqlite", "Tenure, SQLite (default)", "tenure-default", "{sqlite}", "", relay=False, env=LIMITS_ON
    ),
    TenureVariant(
        "tenure-pg-redis",
        "Tenure, PostgreSQL + Redis",
        "tenure-fleet",
        "{postgresql}",
        "{redis}",
        relay=True,
        env=LIMITS_ON,
    ),
    TenureVariant(
        "tenure-pg-rabbitmq",
        "Tenure, PostgreSQL + RabbitMQ",
        "tenure-fleet",
        "{postgresql}",
        "{amqp}",
        relay=True,
        env=LIMITS_ON,
    ),
    # Jobs and messages in one PostgreSQL database (broker.postgres): no outbox, no relay.
    TenureVariant(
        "tenure-pg",
        "Tenure, PostgreSQL (broker in the job database)",
        "tenure-fleet",
        "{postgresql}",
        "{postgresql}",
        relay=False,
        env=LIMITS_ON,
    ),
)


class TenureDeployment(Deployment):
    app = "tenure_app"

    def __init__(self, env: dict[str, str], database_url: str, queue: str) -> None:
        super().__init__(env)
        self.store = StoreReader(database_url)
        self.queue = queue

    def worker_commands(self, processes: int, threads: int) -> list[list[str]]:
        return [
            [venv_bin("tenure"), "worker", APP, "--processes", str(processes), "--threads", str(threads)]
            + ["--queues", self.queue]
        ]

    def counts(self) -> Counts:
        rows = dict(self.store.rows("SELECT status, count(*) FROM jobs GROUP BY status"))
        return Counts(rows.pop("succeeded", 0), rows)

    def close(self) -> None:
        self.store.close()


class Tenure(System):
    def __init__(self, variant: TenureVariant) -> None:
        self.variant = variant
        self.name = variant.name
        self.label = variant.label
        self.group = variant.group
        self.postgres = "{postgresql}" in variant.database_url

    @contextlib.contextmanager
    def deploy(self, rc: RoundContext) -> Iterator[Deployment]:
        v = self.variant
        templates = v.database_url + v.broker_url
        with contextlib.ExitStack() as stack:
            urls = {"sqlite": f"sqlite:///{rc.workdir / 'tenure.db'}", "amqp": services.RABBITMQ_URL}
            if "{postgresql}" in templates:
                urls["postgresql"] = stack.enter_context(services.postgres_database(rc.database_name(self.name)))
            if "{redis}" in templates:
                urls["redis"] = stack.enter_context(services.redis_database())
            if "{amqp}" in templates:
                stack.callback(services.delete_rabbitmq_queues, [rc.queue])
            database_url = v.database_url.format(**urls)
            env = base_env(
                TENURE_DATABASE_URL=database_url,
                TENURE_BROKER_URL=v.broker_url.format(**urls),
                BENCH_PEERS_QUEUE=rc.queue,
                BENCH_TENURE_KIND_OPTIONS=json.dumps(dict(v.kind_options)),
                **v.env,
            )
            run_tool([venv_bin("tenure"), "db", "upgrade"], env, rc.log, rc.run_id)
            if v.relay:
                relay = Launched([venv_bin("tenure"), "relay", "--app", APP], env, rc.log, rc.run_id)
                stack.callback(relay.stop)
            yield TenureDeployment(env, database_url, rc.queue)


SYSTEMS: tuple[System, ...] = tuple(Tenure(v) for v in VARIANTS)
