"""Schedules that submit jobs: the fire row, the job and its message share one transaction."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker import SQLiteBroker
from jobs.db import make_engine
from jobs.registry import registry
from tasks.scheduling import Scheduler, every, schedule_job

from .conftest import Clock


@pytest.fixture()
def kind(sched_broker: SQLiteBroker) -> Iterator[str]:
    name = f"sched_kind_{uuid.uuid4().hex[:8]}"

    def run(ctx, **payload):  # type: ignore[no-untyped-def]
        return payload

    registry.kind(name, queue="sched_jobs", broker=sched_broker)(run)
    yield name
    registry.remove(name)


def test_competing_schedulers_submit_one_job_per_tick(
    scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock, kind: str, sqlite_url: str, sqlite_path: Path
) -> None:
    trigger = schedule_job(kind, every(seconds=1, catchup="all"), payload={"scope": "daily"}, broker=sched_broker)
    spec = trigger.options["periodic"]
    assert spec.schedule_name == f"schedule.{kind}"
    others = [Scheduler(sched_broker, make_engine(sqlite_url), clock=clock) for _ in range(3)]
    scheduler.fire_due(spec)
    for _ in range(20):
        clock.now = (clock.now // 1000 + 1) * 1000 + 3
        threads = [threading.Thread(target=s.fire_due, args=(spec, clock.now)) for s in [scheduler, *others]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    fires = scheduler.fires(spec.schedule_name, limit=100)
    assert len(fires) == 20 and all(f.job_id and f.message_id is None for f in fires)
    with sqlite3.connect(sqlite_path) as conn:
        jobs = conn.execute("SELECT id, idempotency_key, payload FROM jobs WHERE kind = ?", (kind,)).fetchall()
        messages = conn.execute("SELECT count(*) FROM broker_messages WHERE actor = ?", (kind,)).fetchone()[0]
    assert len(jobs) == 20 and messages == 20
    assert {j[0] for j in jobs} == {f.job_id for f in fires}
    assert {j[1] for j in jobs} == {f"schedule:{spec.schedule_name}:{f.fire_time}" for f in fires}
    # Run now adds one more job, marked manual
    manual = scheduler.run_now(spec.schedule_name, by="carol")
    assert manual.cause == "manual" and manual.job_id and manual.fired_by == "carol"
    with sqlite3.connect(sqlite_path) as conn:
        assert conn.execute("SELECT count(*) FROM jobs WHERE kind = ?", (kind,)).fetchone()[0] == 21
    for s in others:
        s.engine.dispose()


def test_an_unknown_kind_fires_nothing(scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock) -> None:
    trigger = schedule_job("no_such_kind", every(seconds=1), broker=sched_broker)
    spec = trigger.options["periodic"]
    scheduler.fire_due(spec)
    clock.now += 1_000
    with pytest.raises(LookupError, match="no_such_kind"):
        scheduler.fire_due(spec)
    assert scheduler.fires(spec.schedule_name) == []
