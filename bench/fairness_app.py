"""The worker module of the fairness benchmark: ``python -m dramatiq bench.fairness_app``.

Built from the environment set by :mod:`bench.fairness_bench` (:func:`bench.job_worker.boot`: the SQLite broker on
the job file, the job middleware, and the start gate and completion ledger in front of it).

Two no-op kinds on one queue, ``tenure_bench_fair``:

* ``bench_fair_limited`` declares a per-owner concurrency limit, ``bench_fair.owner``, of :data:`OWNER_LIMIT`:
  far more than the 16 worker threads can run, so it never limits how many run, but every submit, claim and
  completion of the kind goes through the limit's bookkeeping (key lock, counts, the claim's re-check, the
  release). The limit counts admitted jobs too, so with fair share off an owner's limited jobs beyond 1,000 queued
  wait for their key and are admitted as others finish; with fair share on, its window admits fewer;
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
