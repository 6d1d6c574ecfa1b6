"""The worker module of the job-layer benchmark: ``python -m dramatiq bench.jobs_app``.

Built from the environment (set by :mod:`bench.jobs_bench`), the way ``tasks/__init__.py`` builds a real worker:

* ``TENURE_DATABASE_URL`` — the migrated SQLite file; the broker is a :class:`broker.SQLiteBroker` on the same file
  (``TENURE_BROKER_URL`` unset), so a job's row and its message share one transaction;
* the other ``TENURE_*`` settings as :meth:`Settings.from_env` reads them (defaults unless set);
* ``BENCH_LEDGER_DIR`` — where completions are recorded (see :mod:`bench.ledger`).

Middleware: Dramatiq's defaults, :func:`jobs.install` (the job binding, first in line), and in front of it
:class:`LedgerGate`, which holds every message at the benchmark's start gate *before* the job is claimed; its
lifecycle observer bumps the per-process ledger counter on ``job.completed``, which the job layer reports only
after the completion has committed. So a recorded message is one job through claim + ``progress`` + complete,
timed from gate-open like the raw drain.

The one kind, ``bench_job_noop`` on queue ``tenure_bench_jobs``, only calls ``ctx.progress(1.0, "done")``.

``BENCH_NO_PROGRESS_FENCE=1`` replaces ``JobContext.progress`` with one that only records the report in memory
(written with the completion), to measure what the fenced read of a coalesced progress costs: an experiment of
docs/benchmarks.md, not a mode of the product.
"""

from __future__ import annotations

import os
from typing import Any

import dramatiq
from dramatiq.broker import Broker
from dramatiq.middleware import Middleware

import jobs
from broker import SQLiteBroker
from settings.environment import Settings, set_current_settings

from .ledger import LedgerWriter

QUEUE = "tenure_bench_jobs"
KIND = "bench_job_noop"


def bench_job_noop(ctx: jobs.JobContext) -> None:
    """The benchmark's job: one progress write, then return (→ succeeded)."""
    ctx.progress(1.0, "done")


class LedgerGate(Middleware):
    """Wait at the start gate before the claim; record the message once the actor (and the job's outcome) is done."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def before_process_message(self, broker: Broker, message: Any) -> None:
        LedgerWriter.for_this_process(self.directory).wait_for_go()

    def observe(self, fields: dict[str, Any]) -> None:
        """A lifecycle observer: ``job.completed`` is reported once the job's completion has committed
        (on the SQLite broker it commits with the message's ack, after the actor returned)."""
        if fields["event"] == "job.completed":
            LedgerWriter.for_this_process(self.directory).record(0.0)


def build_broker(settings: Settings) -> SQLiteBroker:
    """The SQLite broker exactly as ``tasks/__init__.py`` builds it (Dramatiq's default middleware)."""
    return SQLiteBroker(
        settings.broker_url,
        lease_ttl_ms=int(settings.broker_lease_ttl_s * 1000),
        busy_timeout_ms=settings.sqlite_busy_timeout_ms,
    )


def _progress_in_memory(self: jobs.JobContext, fraction: float | None = None, message: str | None = None) -> None:
    with self._progress_lock:
        self._pending_progress = (fraction, message)


if os.environ.get("BENCH_NO_PROGRESS_FENCE") == "1":
    jobs.JobContext.progress = _progress_in_memory  # type: ignore[method-assign]


def declare_kind(broker: Broker, registry: jobs.Registry) -> jobs.Kind:
    return registry.kind(KIND, queue=QUEUE, safe_to_rerun=True, broker=broker)(bench_job_noop)


kind: jobs.Kind | None = None
if os.environ.get("BENCH_LEDGER_DIR") and os.environ.get("TENURE_DATABASE_URL"):
    _settings = Settings.from_env()
    set_current_settings(_settings)
    _broker = build_broker(_settings)
    dramatiq.set_broker(_broker)
    jobs.install(_broker, _settings)
    _gate = LedgerGate(os.environ["BENCH_LEDGER_DIR"])
    _broker.add_middleware(_gate, before=jobs.JobMiddleware)
    jobs.lifecycle.observers.append(_gate.observe)
    kind = declare_kind(_broker, jobs.registry)
