"""The common part of the job-layer benchmarks' worker modules (:mod:`bench.jobs_app`, :mod:`bench.fairness_app`).

:func:`boot` builds a worker from the environment the way ``tasks/__init__.py`` builds a real one:

* ``TENURE_DATABASE_URL`` — the migrated SQLite file; the broker is a :class:`broker.SQLiteBroker` on the same file
  (``TENURE_BROKER_URL`` unset), so a job's row and its message share one transaction;
* the other ``TENURE_*`` settings as :meth:`Settings.from_env` reads them (defaults unless set);
* ``BENCH_LEDGER_DIR`` — where completions are recorded (see :mod:`bench.ledger`).

Middleware: Dramatiq's defaults, :func:`jobs.install` (the job binding, first in line), and in front of it
:class:`LedgerGate`, which holds every message at the benchmark's start gate *before* the job is claimed; its
lifecycle observer bumps the per-process ledger counter on ``job.completed``, which the job layer reports only
after the completion has committed. So a recorded message is one job through claim, actor and completion.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq.broker import Broker
from dramatiq.middleware import Middleware

import jobs
from broker import SQLiteBroker
from settings.environment import Settings, set_current_settings

from .ledger import LedgerWriter


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


def configured() -> bool:
    """Whether this process was started as a benchmark worker (its database and ledger are set)."""
    return bool(os.environ.get("BENCH_LEDGER_DIR") and os.environ.get("TENURE_DATABASE_URL"))


def boot(declare: Callable[[Broker, jobs.Registry], Any]) -> Any:
    """Build this worker process (see the module docstring); *declare* puts the kinds on its broker and
    registry. Returns what *declare* returns."""
    settings = Settings.from_env()
    set_current_settings(settings)
    broker = build_broker(settings)
    dramatiq.set_broker(broker)
    jobs.install(broker, settings)
    gate = LedgerGate(os.environ["BENCH_LEDGER_DIR"])
    broker.add_middleware(gate, before=jobs.JobMiddleware)
    jobs.lifecycle.observers.append(gate.observe)
    return declare(broker, jobs.registry)
