"""The job acceptance app on a fleet host: ``tenure worker tests.acceptance.multihost.fleet_app``.

It is the chaos harness's app (``tests.acceptance.jobs.apps.jobs_app``: settings, Redis broker,
job middleware, its kinds) plus Tenure's metrics middleware and one kind, ``acc_fleet``, that
publishes its domain row with the name of the host it ran on (``TENURE_TEST_HOST``) in the same
transaction as the job's result: the database then knows, per host, which jobs completed there.
"""

from __future__ import annotations

import os
import time

from sqlalchemy import text

import jobs
from jobs import JobContext
from monitoring.middleware import MetricsMiddleware
from tests.acceptance.jobs.apps.jobs_app import QUEUE, broker

broker.add_middleware(MetricsMiddleware())
HOST = os.environ.get("TENURE_TEST_HOST", "")
KIND = "acc_fleet"


@jobs.registry.kind(KIND, queue=QUEUE, backoff=lambda attempt: 0.05)
def fleet(ctx: JobContext, *, n: int) -> None:
    time.sleep(0.002)
    with ctx.result_transaction() as tx:
        tx.connection.execute(
            text("INSERT INTO fleet_runs (job_id, attempt, n, host) VALUES (:j, :a, :n, :h)"),
            {"j": ctx.job_id, "a": ctx.attempt, "n": n, "h": HOST},
        )
        tx.complete({"n": n})


__all__ = ["KIND", "QUEUE", "broker"]
