"""The worker module of :mod:`bench.jobs_steady`: the no-op job kind of :mod:`bench.jobs_app`, no gate, no ledger.

``BENCH_NO_PROGRESS_FENCE=1`` works here too (:mod:`bench.jobs_app` applies it when imported).
"""

from __future__ import annotations

import dramatiq

import jobs
from settings.environment import Settings, set_current_settings

from .job_worker import build_broker
from .jobs_app import declare_kind

RAW_QUEUE = "tenure_bench_raw"

_settings = Settings.from_env()
set_current_settings(_settings)
_broker = build_broker(_settings)
dramatiq.set_broker(_broker)
jobs.install(_broker, _settings)
kind = declare_kind(_broker, jobs.registry)


@dramatiq.actor(queue_name=RAW_QUEUE, max_retries=0)
def raw_noop() -> None:
    """The raw broker's no-op message (``--raw``): no job, no middleware work beyond Dramatiq's defaults."""
