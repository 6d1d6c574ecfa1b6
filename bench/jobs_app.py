"""The worker module of the job-layer benchmark: ``python -m dramatiq bench.jobs_app``.

Built from the environment set by :mod:`bench.jobs_bench` (:func:`bench.job_worker.boot`: the SQLite broker on the
job file, the job middleware, and the start gate and completion ledger in front of it).

The one kind, ``bench_job_noop`` on queue ``tenure_bench_jobs``, only calls ``ctx.progress(1.0, "done")``.

``BENCH_NO_PROGRESS_FENCE=1`` replaces ``JobContext.progress`` with one that only records the report in memory
(written with the completion), to measure what the fenced read of a coalesced progress costs: an experiment of
docs/benchmarks.md, not a mode of the product.
"""

from __future__ import annotations

import os

from dramatiq.broker import Broker

import jobs

from .job_worker import boot, configured

QUEUE = "tenure_bench_jobs"
KIND = "bench_job_noop"


def bench_job_noop(ctx: jobs.JobContext) -> None:
    """The benchmark's job: one progress write, then return (→ succeeded)."""
    ctx.progress(1.0, "done")


def _progress_in_memory(self: jobs.JobContext, fraction: float | None = None, message: str | None = None) -> None:
    with self._progress_lock:
        self._pending_progress = (fraction, message)


if os.environ.get("BENCH_NO_PROGRESS_FENCE") == "1":
    jobs.JobContext.progress = _progress_in_memory  # type: ignore[method-assign]


def declare_kind(broker: Broker, registry: jobs.Registry) -> jobs.Kind:
    return registry.kind(KIND, queue=QUEUE, safe_to_rerun=True, broker=broker)(bench_job_noop)


kind: jobs.Kind | None = boot(declare_kind) if configured() else None
