"""The worker app of the actor acceptance tests: ``python -m dramatiq tests.acceptance.tasks.apps.worker:compose``.

Tenure's own composition root (:func:`tasks.compose`: settings and broker from the ``TENURE_*``
environment, the job and schedule middleware, every real kind), exactly as a deployment's worker
runs it, plus a middleware that makes a SIGTERM'd test worker exit quickly.
"""

from __future__ import annotations

import faulthandler
import signal

import tasks
from tests.fast_stop import FastStop


def compose() -> None:
    # `kill -USR1 <pid>` dumps every thread's stack into the worker's log (for a test that hangs).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    composition = tasks.compose()
    composition.broker.add_middleware(FastStop())  # a SIGTERM'd test worker exits in ~0.4 s instead of ~2.5 s
