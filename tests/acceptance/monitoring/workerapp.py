"""The Dramatiq app the acceptance tests run with ``python -m dramatiq``: SQLiteBroker + MetricsMiddleware.

Environment: ``TENURE_TEST_BROKER_URL`` (the SQLite file), ``TENURE_TEST_SIGNAL_DIR`` (files the
``hold_*`` actors write when they start and wait for before they finish), ``PROMETHEUS_MULTIPROC_DIR``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dramatiq

from broker import SQLiteBroker
from monitoring.middleware import MetricsMiddleware

broker = SQLiteBroker(os.environ["TENURE_TEST_BROKER_URL"], lease_ttl_ms=3_000)
broker.add_middleware(MetricsMiddleware(lease_poll_interval_s=0.2))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="work", max_retries=0)
def work(i: int) -> None:
    pass


@dramatiq.actor(queue_name="work", max_retries=1, min_backoff=10, max_backoff=20)
def fail() -> None:
    raise ValueError("fails on purpose")


def _hold(tag: str) -> None:
    signals = Path(os.environ["TENURE_TEST_SIGNAL_DIR"])
    (signals / f"started-{tag}").write_text(str(os.getpid()))
    deadline = time.monotonic() + 120
    while not (signals / f"release-{tag}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)


@dramatiq.actor(queue_name="hold_a", max_retries=0)
def hold_a(tag: str) -> None:
    _hold(tag)


@dramatiq.actor(queue_name="hold_b", max_retries=0)
def hold_b(tag: str) -> None:
    _hold(tag)
