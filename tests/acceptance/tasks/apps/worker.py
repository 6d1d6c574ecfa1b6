"""The worker app of the actor acceptance tests: ``python -m dramatiq tests.acceptance.tasks.apps.worker``.

``tasks`` picks the broker from ``TENURE_BROKER_URL`` (the test's SQLite file); this module makes
sure the job middleware is on it (until ``tasks/__init__.py`` installs it itself) and then declares
the actors, exactly as a deployment's worker would. Everything else comes from ``TENURE_*`` variables.
"""

from __future__ import annotations

import faulthandler
import signal

import dramatiq

import tasks  # noqa: F401  (sets the broker from TENURE_BROKER_URL)
from jobs import JobMiddleware
from jobs import install as install_jobs
from tests.fast_stop import FastStop

# `kill -USR1 <pid>` dumps every thread's stack into the worker's log (for a test that hangs).
faulthandler.register(signal.SIGUSR1, all_threads=True)

broker = dramatiq.get_broker()
if not any(isinstance(m, JobMiddleware) for m in broker.middleware):
    install_jobs(broker)
broker.add_middleware(FastStop())  # a SIGTERM'd test worker exits in ~0.4 s instead of ~2.5 s

from tasks import import_recording, notify, pipeline, render_clip, transcribe  # noqa: E402,F401  (after the middleware)
