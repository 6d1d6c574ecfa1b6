"""What the scheduler tells monitoring: every tick it handles, counted by result, and the next tick it plans.

``tenure_schedule_fires_total{schedule, result}`` and ``tenure_schedule_next_fire_timestamp_seconds``
feed ``TenureNoSchedulerFire`` and ``TenureScheduleOverdue`` (monitoring/prometheus/alerts.yml).
Counters are read from this process's registry (per-test schedule names, so values are deltas).
"""

from __future__ import annotations

import logging
import threading

import dramatiq
import pytest

import monitoring.metrics as m
from broker import SQLiteBroker
from jobs.db import make_engine
from tasks.scheduling import Scheduler, every

from .conftest import Clock

MINUTE = 60_000


def declare(broker: SQLiteBroker, name: str, spec):  # type: ignore[no-untyped-def]
    def fn() -> None:
        pass

    return dramatiq.actor(fn, actor_name=name, queue_name="sched", broker=broker, periodic=spec).options["periodic"]


def fires(schedule: str) -> dict[str, float | None]:
    return {
        r: m.REGISTRY.get_sample_value("tenure_schedule_fires_total", {"schedule": schedule, "result": r})
        for r in m.SCHEDULE_RESULTS
    }


def next_fire(scheduler: Scheduler, name: str) -> int | None:
    return {v.name: v for v in scheduler.list()}[name].next_fire_ms


def test_a_declared_schedule_exports_its_fire_counters_at_zero(sched_broker: SQLiteBroker) -> None:
    declare(sched_broker, "declared-only", every(seconds=30))
    assert fires("declared-only") == {"fired": 0.0, "duplicate": 0.0, "skipped": 0.0}


def test_competing_schedulers_count_each_tick_once_per_process(
    scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock, sqlite_url: str
) -> None:
    spec = declare(sched_broker, "contended", every(seconds=1, catchup="all", grace_s=30))
    others = [Scheduler(sched_broker, make_engine(sqlite_url), clock=clock) for _ in range(3)]
    everyone = [scheduler, *others]
    for s in everyone:  # every process has looked once: the first anchors, the others see nothing due
        s.fire_due(spec)

    # When four schedulers wake together at each of 10 ticks (claims race: some lose at the fence,
    # some read the row after the winner committed)
    for _ in range(10):
        clock.now = (clock.now // 1000 + 1) * 1000 + 2
        threads = [threading.Thread(target=s.fire_due, args=(spec, clock.now)) for s in everyone]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # Then each tick was fired by one process and counted as a duplicate by the three others
    assert fires("contended") == {"fired": 10.0, "duplicate": 30.0, "skipped": 0.0}
    for s in others:
        s.engine.dispose()


def test_ticks_dropped_by_the_policy_or_passing_while_paused_count_as_skipped(
    scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    spec = declare(sched_broker, "minutely", every(seconds=60, catchup="latest"))
    clock.now = (clock.now // MINUTE) * MINUTE + 500
    scheduler.fire_due(spec)  # anchor
    # Given every scheduler down for five ticks (waking 20 s after the fifth)
    clock.now += 5 * MINUTE + 20_000
    with caplog.at_level(logging.INFO, logger="tenure.lifecycle"):
        fired = scheduler.fire_due(spec)
    # Then the latest fires (a catch-up) and the four before it are skipped, in one INFO line
    assert [f.cause for f in fired] == ["catchup"]
    assert fires("minutely") == {"fired": 1.0, "duplicate": 0.0, "skipped": 4.0}
    assert [r.getMessage() for r in caplog.records if r.name == "tenure.lifecycle"] == [
        "event=schedule.fire schedule=minutely result=skipped ticks=4"
    ]

    # When it is paused for three ticks
    scheduler.pause("minutely")
    for _ in range(3):
        clock.now = (clock.now // MINUTE + 1) * MINUTE + 500
        assert scheduler.fire_due(spec) == []
    # Then each passing tick counts as skipped, and no next tick is planned: a paused schedule is not
    # overdue, however long it stays paused
    assert fires("minutely") == {"fired": 1.0, "duplicate": 0.0, "skipped": 7.0}
    assert next_fire(scheduler, "minutely") is None

    # And after the resume the next tick fires on time
    scheduler.resume("minutely")
    clock.now = (clock.now // MINUTE + 1) * MINUTE + 500
    assert [f.cause for f in scheduler.fire_due(spec)] == ["schedule"]
    assert fires("minutely") == {"fired": 2.0, "duplicate": 0.0, "skipped": 7.0}


def test_next_fire_is_the_schedulers_plan_and_goes_stale_when_none_runs(
    scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock
) -> None:
    spec = declare(sched_broker, "planned", every(seconds=30, catchup="none"))
    # Before any scheduler looked: the declaration's next tick
    assert next_fire(scheduler, "planned") == spec.next_tick(clock.now)
    scheduler.fire_due(spec)
    planned = spec.next_tick(clock.now)
    assert next_fire(scheduler, "planned") == planned

    # When no scheduler wakes for ten minutes (until 12 s past a tick), the planned tick stays where it
    # was, in the past: a resync (run by a worker, or by hand from the UI) does not move it
    clock.now += 10 * MINUTE + 5_000
    scheduler.refresh()
    assert next_fire(scheduler, "planned") == planned < clock.now - 9 * MINUTE

    # When a scheduler wakes again and its policy drops every missed tick (catchup="none"), the
    # plan moves to the next tick all the same: the schedule is handled again, not overdue
    assert scheduler.fire_due(spec) == []
    assert next_fire(scheduler, "planned") == spec.next_tick(clock.now) > clock.now
    assert fires("planned")["skipped"] == 20.0  # every tick of the ten minutes
