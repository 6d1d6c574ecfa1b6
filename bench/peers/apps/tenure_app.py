"""Tenure in :mod:`bench.jobs_peers`: a real deployment's composition plus one no-op kind.

``tenure worker bench.peers.apps.tenure_app:compose`` and ``tenure relay --app bench.peers.apps.tenure_app:compose``
run it the way ``Procfile.fleet`` runs ``tasks:compose``: :func:`compose` is :func:`tasks.compose` (settings from
the ``TENURE_*`` environment, the broker of ``TENURE_BROKER_URL``, the job middleware, metrics, schedules), and
this module has declared the benchmark's kind in the job registry first, so the composition binds it too.

* ``BENCH_PEERS_QUEUE``: the kind's queue (unique per benchmark run: RabbitMQ queues outlive a process);
* ``BENCH_TENURE_KIND_OPTIONS``: a JSON object of extra :meth:`jobs.Registry.kind` options, from the Tenure
  variant being measured (:mod:`bench.peers.tenure`);
* ``BENCH_TENURE_OWNER_LIMIT``: declare a concurrency limit per owner of this many running jobs (a limit
  that never binds at 8 or 16 threads, so its admission work is measured, not its waiting).

The producer (:func:`open_producer`) composes itself as the web app does and calls :func:`jobs.submit`.
"""

from __future__ import annotations

import json
import os

import jobs
import tasks
from bench.peers.ledger import started
from jobs.limits import ConcurrencyLimit

QUEUE = os.environ.get("BENCH_PEERS_QUEUE", "bench_peers")
KIND = "bench_peers_noop"
OWNER = "bench"


def bench_peers_noop(ctx: jobs.JobContext, stamp: float = 0.0) -> None:
    """The no-op job: records its start."""
    started(stamp)


_options = json.loads(os.environ.get("BENCH_TENURE_KIND_OPTIONS") or "{}")
if os.environ.get("BENCH_TENURE_OWNER_LIMIT"):
    _options["concurrency"] = ConcurrencyLimit("bench.owner", limit=int(os.environ["BENCH_TENURE_OWNER_LIMIT"]))
jobs.registry.kind(KIND, queue=QUEUE, safe_to_rerun=True, **_options)(bench_peers_noop)


def compose() -> None:
    """Dramatiq's broker argument: compose this process as every Tenure process does."""
    tasks.compose()


class Producer:
    """Submits jobs as the web app does: one :func:`jobs.submit` (one transaction) per job."""

    def __init__(self) -> None:
        self.settings = tasks.compose().settings
        self.engine = jobs.make_engine(self.settings.database_url, busy_timeout_ms=self.settings.sqlite_busy_timeout_ms)

    def submit(self, stamp: float) -> str:
        record: jobs.JobRecord = jobs.submit(
            self.engine, owner_id=OWNER, kind=KIND, payload={"stamp": stamp}, settings=self.settings
        )
        return record.id

    def close(self) -> None:
        self.engine.dispose()


def open_producer() -> Producer:
    return Producer()
