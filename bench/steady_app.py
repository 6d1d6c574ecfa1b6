"""The worker module of :mod:`bench.jobs_steady`: the no-op job kind of :mod:`bench.jobs_app`, no gate, no ledger.

``BENCH_NO_PROGRESS_FENCE=1`` replaces ``JobContext.progress`` with one that only records the report in memory
(written with the completion), to measure what the fenced read of a coalesced progress costs — an experiment,
not a mode of the product.
"""

from __future__ import annotations

import os
from typing import Any

import dramatiq

import jobs
from jobs.context import JobContext

from .jobs_app import build_broker, declare_kind

RAW_QUEUE = "tenure_bench_raw"

_settings = jobs.Settings.from_env()
jobs.settings.set_current_settings(_settings)
_broker = build_broker(_settings)
dramatiq.set_broker(_broker)
jobs.install(_broker, _settings)
kind = declare_kind(_broker, jobs.registry)


@dramatiq.actor(queue_name=RAW_QUEUE, max_retries=0)
def raw_noop() -> None:
    """The raw broker's no-op message (``--raw``): no job, no middleware work beyond Dramatiq's defaults."""


if os.environ.get("BENCH_NO_PROGRESS_FENCE") == "1":

    def _progress_in_memory(self: JobContext, fraction: float | None = None, message: str | None = None) -> Any:
        with self._progress_lock:
            self._pending_progress = (fraction, message)

    JobContext.progress = _progress_in_memory  # type: ignore[method-assign]
