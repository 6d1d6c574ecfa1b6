"""A worker app for the job acceptance tests: ``python -m dramatiq tests.acceptance.jobs.apps.jobs_app``.

Everything comes from the environment (read here, in the process's composition root):
``TENURE_DATABASE_URL``, ``TENURE_BROKER_URL``, ``TENURE_JOB_LEASE_TTL_S``,
``TENURE_BROKER_LEASE_TTL_S`` (SQLite and PostgreSQL broker lease) and ``TENURE_TEST_REDIS_NAMESPACE``. With
``TENURE_TEST_DEFAULT_BROKER`` set, a server broker is the one a deployment gets: ``make_broker(url)``
with no options, as ``tasks/__init__.py`` builds it.
"""

from __future__ import annotations

import os
import time

import dramatiq
from sqlalchemy import text

import jobs
from broker import SQLiteBroker, make_broker
from jobs import JobContext
from settings.environment import Settings, set_current_settings
from tests.acceptance.jobs.apps.limits import LIMITED
from tests.fast_stop import FastStop

QUEUE = "jobs_acceptance"

settings = Settings.from_env()
set_current_settings(settings)
if settings.broker_url.startswith("sqlite"):
    broker = SQLiteBroker(
        settings.broker_url, lease_ttl_ms=int(settings.broker_lease_ttl_s * 1000), reap_interval_s=0.25
    )
elif settings.broker_url.startswith("postgres"):
    from broker.postgres import PostgresBroker

    broker = PostgresBroker(
        settings.broker_url, lease_ttl_ms=int(settings.broker_lease_ttl_s * 1000), reap_interval_s=0.25
    )
elif os.environ.get("TENURE_TEST_DEFAULT_BROKER"):
    broker = make_broker(settings.broker_url)
else:
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(
        url=settings.broker_url,
        namespace=os.environ.get("TENURE_TEST_REDIS_NAMESPACE", "tenure-acceptance"),
        heartbeat_timeout=int(settings.broker_lease_ttl_s * 1000),
        # a killed worker's prefetched messages come back at the next maintenance: run it often
        maintenance_chance=100_000,
        dead_message_ttl=60_000,
    )
dramatiq.set_broker(broker)
middleware = jobs.install(broker, settings)
jobs.registry.bind(broker)  # the kinds below are declared on this broker
broker.add_middleware(FastStop())  # a SIGTERM'd test worker exits in ~0.4 s instead of ~2.5 s


def block(ctx: JobContext, *, block_attempts: int = 1) -> dict[str, int]:
    """Report progress, then hang (without checkpoints) on the first *block_attempts* attempts."""
    ctx.progress(0.1, f"attempt {ctx.attempt} started")
    while ctx.attempt <= block_attempts:
        time.sleep(0.05)
    return {"attempt": ctx.attempt}


jobs.registry.kind("acc_block_safe", queue=QUEUE)(block)
jobs.registry.kind("acc_block_unsafe", queue=QUEUE, safe_to_rerun=False)(block)


@jobs.registry.kind("acc_chaos", queue=QUEUE, backoff=lambda attempt: 0.05)
def chaos(ctx: JobContext, *, n: int) -> None:
    """Publish one domain row per job, atomically with the job's result."""
    time.sleep(0.002)
    with ctx.result_transaction() as tx:
        tx.connection.execute(
            text("INSERT INTO chaos_runs (job_id, attempt, n) VALUES (:j, :a, :n)"),
            {"j": ctx.job_id, "a": ctx.attempt, "n": n},
        )
        tx.complete({"n": n})


@jobs.registry.kind("acc_stuck", queue=QUEUE)
def stuck(ctx: JobContext, *, fifo: str) -> str:
    """Block inside C code until the test opens *fifo* for writing: ``open`` of a FIFO waits in the kernel
    for a writer, where the time limit's asynchronous exception cannot reach the thread (it fires only
    between bytecodes, i.e. once the call returns)."""
    ctx.progress(0.1, "stuck")
    with open(fifo, "rb") as f:
        return f.read().decode()


@jobs.registry.kind("acc_echo", queue=QUEUE)
def echo(ctx: JobContext, **payload: object) -> dict[str, object]:
    return payload


@jobs.registry.kind("acc_limited", queue=QUEUE, concurrency=LIMITED)
def limited(ctx: JobContext, *, key: str, sleep_ms: int = 0) -> None:
    """Hold a slot of *key* for *sleep_ms*."""
    time.sleep(sleep_ms / 1000)


@jobs.registry.kind("acc_noop", queue=QUEUE)
def noop(ctx: JobContext) -> None:
    """Nothing: the fairness test counts starts."""
