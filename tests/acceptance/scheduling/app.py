"""A Tenure app for real ``periodiq``/``dramatiq`` processes in the schedule acceptance tests.

It builds its own SQLiteBroker (on ``SCHED_TEST_DB``, with a lease TTL the test chooses) and
declares the periodic actors listed in ``SCHED_TEST_SCHEDULES``. Actors write what they do to a
separate log database so the test can wait on rows.
"""

from __future__ import annotations

import os
import sqlite3
import time

import dramatiq

from broker import SQLiteBroker
from jobs.registry import registry
from tasks.maintenance import run_resync
from tasks.scheduling import every, install, schedule_job
from tests.fast_stop import FastStop

DB = os.environ["SCHED_TEST_DB"]
LOG_DB = os.environ["SCHED_TEST_LOG"]
ROLE = os.environ.get("SCHED_TEST_ROLE", "")
SCHEDULES = set(os.environ.get("SCHED_TEST_SCHEDULES", "").split(","))

broker = SQLiteBroker(
    f"sqlite:///{DB}",
    lease_ttl_ms=int(os.environ.get("SCHED_TEST_LEASE_TTL_MS", "30000")),
    reap_interval_s=float(os.environ.get("SCHED_TEST_REAP_S", "1")),
)
install(broker)
broker.add_middleware(FastStop())  # a SIGTERM'd test worker exits in ~0.4 s instead of ~2.5 s
dramatiq.set_broker(broker)


def log(kind: str, n: int | None = None) -> None:
    with sqlite3.connect(LOG_DB, timeout=30) as conn:
        conn.execute(
            "INSERT INTO log (kind, role, pid, n, at) VALUES (?, ?, ?, ?, ?)", (kind, ROLE, os.getpid(), n, time.time())
        )


def _periodic(name: str, spec):  # type: ignore[no-untyped-def]
    return {"periodic": spec} if name in SCHEDULES else {}


@dramatiq.actor(queue_name="ticks", **_periodic("tick", every(seconds=1, catchup="all", grace_s=30)))
def tick() -> None:
    log("tick")


@registry.kind("tick_job", queue="tick_jobs", broker=broker)
def tick_job(ctx) -> None:  # type: ignore[no-untyped-def]
    log("tick_job")


if "tick_jobs" in SCHEDULES:
    schedule_job("tick_job", every(seconds=1, catchup="all", grace_s=30, name="tick_jobs"), broker=broker)


@dramatiq.actor(
    queue_name="maintenance",
    max_retries=0,
    **_periodic("fast_resync", every(seconds=1, catchup="latest", grace_s=5, max_staleness_s=5)),
)
def fast_resync() -> None:
    """The resync's work (tasks.maintenance.run_resync), on a 1-second schedule for the test."""
    report = run_resync(broker)
    log("resync", report.leases_reaped)


@dramatiq.actor(queue_name="work", max_retries=0)
def work(n: int) -> None:
    log("work-start", n)
    if ROLE == "victim":
        time.sleep(300)  # SIGKILLed here
    log("work-done", n)
