"""The worker module of the fairness benchmark: ``python -m dramatiq bench.fairness_app``.

Built from the environment set by :mod:`bench.fairness_bench` (:func:`bench.job_worker.boot`: the SQLite broker on
the job file, the job middleware, and the start gate and completion ledger in front of it).

Two no-op kinds on one queue, ``tenure_bench_fair``:

* ``bench_fair_limited`` declares a per-owner concurrency limit, ``bench_fair.owner``, of :data:`OWNER_LIMIT`
  running jobs: more than a benchmark's owner ever has admitted or running, so it never makes a job wait, but
  every submit and claim of the kind goes through the limit's bookkeeping (key lock, counts, the claim's re-check);
* ``bench_fair_plain`` declares no limit.
"""

from __future__ import annotations

from dramatiq.broker import Broker

import jobs
from jobs.limits import ConcurrencyLimit

from .job_worker import boot, configured

QUEUE = "tenure_bench_fair"
LIMITED = "bench_fair_limited"
PLAIN = "bench_fair_plain"
OWNER_LIMIT = 1000


def bench_fair_limited(ctx: jobs.JobContext) -> None:
    """A no-op job of the limited kind (→ succeeded)."""


def bench_fair_plain(ctx: jobs.JobContext) -> None:
    """A no-op job of the kind without limits (→ succeeded)."""


def declare_kinds(broker: Broker, registry: jobs.Registry) -> None:
    limit = ConcurrencyLimit("bench_fair.owner", limit=OWNER_LIMIT, key="owner")
    registry.kind(LIMITED, queue=QUEUE, concurrency=limit, broker=broker)(bench_fair_limited)
    registry.kind(PLAIN, queue=QUEUE, broker=broker)(bench_fair_plain)


if configured():
    boot(declare_kinds)
