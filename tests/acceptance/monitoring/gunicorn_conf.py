"""gunicorn settings for the acceptance tests: the child_exit hook the real web app will use too."""

from __future__ import annotations

from typing import Any

from monitoring import metrics
from monitoring.exposition import mark_dead

workers = 2
worker_class = "sync"
timeout = 30
accesslog = None
loglevel = "info"


def child_exit(server: Any, worker: Any) -> None:
    mark_dead(worker.pid)
    server.log.info("tenure: live gauges of worker %s removed", worker.pid)


def post_fork(server: Any, worker: Any) -> None:
    metrics.WEB_WORKERS.inc()
