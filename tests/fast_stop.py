"""A middleware for the worker apps of the acceptance tests: Dramatiq's worker threads and consumers poll
every 100 ms instead of every second.

A SIGTERM'd worker waits for each of its threads to notice the stop at its next poll, one group after the
other, so a stop costs ~2.5 s with the default and ~0.4 s with this. Nothing else changes: an idle SQLite
consumer is woken by the broker's wake socket when a message arrives, not by its poll.
"""

from __future__ import annotations

from typing import Any

from dramatiq.broker import Broker
from dramatiq.middleware import Middleware

POLL_MS = 100


class FastStop(Middleware):
    def before_worker_boot(self, broker: Broker, worker: Any) -> None:
        worker.worker_timeout = POLL_MS
