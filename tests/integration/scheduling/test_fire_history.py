"""What the fire rows say happened to each tick (fired, duplicate attempts, skipped ticks) and the
next fire the schedules view promises: on a real SQLite file with an injected clock."""

from __future__ import annotations

import uuid
from pathlib import Path

import dramatiq
import pytest

from broker import SQLiteBroker
from jobs.db import make_engine
from tasks.scheduling import Scheduler, configure, cron, every, install
from tasks.scheduling.store import MAX_SKIPPED_COUNTED, schedule_get

from ..jobs.support import REDIS_URL, postgres_database
from .conftest import Clock

MINUTE = 60_000
H13 = 1_714_568_400_000  # 2024-05-01T13:00:00Z


def declare(broker: SQLiteBroker, name: str, spec):  # type: ignore[no-untyped-def]
    def fn() -> None:
        pass

    return dramatiq.actor(fn, actor_name=name, queue_name="sched", broker=broker, periodic=spec).options["periodic"]


def test_a_catch_up_records_the_ticks_it_skipped(
    scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock
) -> None:
    latest = declare(sched_broker, "latest", cron("0 * * * *", grace_s=4 * 3600))
    strict = declare(sched_broker, "strict", cron("0 * * * *", catchup="none"))
    scheduler.fire_due(latest)
    scheduler.fire_due(strict)
    clock.now = H13 + 3
    on_time = scheduler.fire_due(latest) + scheduler.fire_due(strict)
    assert [(f.cause, f.skipped, f.skipped_from) for f in on_time] == [("schedule", 0, None)] * 2
    # Given no scheduler ran from 13:00 to 16:20
    clock.now = H13 + 3 * 3600 * 1000 + 20 * MINUTE
    # Then "latest" fires 16:00 as a catch-up and records 14:00 and 15:00 as skipped
    (caught_up,) = scheduler.fire_due(latest)
    assert (caught_up.fire_time, caught_up.cause) == (H13 + 3 * 3600 * 1000, "catchup")
    assert (caught_up.skipped, caught_up.skipped_from) == (2, H13 + 3600 * 1000)
    # And "none" fires nothing late; its next on-time tick (17:00) records 14:00..16:00 as skipped
    assert scheduler.fire_due(strict) == []
    clock.now = H13 + 4 * 3600 * 1000 + 2
    (next_on_time,) = scheduler.fire_due(strict)
    assert (next_on_time.cause, next_on_time.skipped, next_on_time.skipped_from) == ("schedule", 3, H13 + 3600 * 1000)
    # And the rows read back say the same
    assert [(f.fire_time, f.skipped) for f in scheduler.fires("strict")] == [(clock.now - 2, 3), (H13, 0)]


def test_skipped_ticks_are_counted_up_to_a_cap(scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock) -> None:
    spec = declare(sched_broker, "every_second", every(seconds=1))
    scheduler.fire_due(spec)
    clock.now = (clock.now // 1000 + 1) * 1000 + 1
    assert len(scheduler.fire_due(spec)) == 1
    clock.now += 2 * 3600 * 1000  # two hours of one-second ticks missed
    (fire,) = scheduler.fire_due(spec)
    assert fire.skipped == MAX_SKIPPED_COUNTED + 1  # "more than 1000"


def test_ticks_missed_while_paused_are_not_skipped_ones(
    scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock
) -> None:
    spec = declare(sched_broker, "pausable", every(seconds=60))
    scheduler.fire_due(spec)
    scheduler.pause("pausable", by="alice")
    clock.now += 10 * MINUTE
    scheduler.resume("pausable")
    clock.now = (clock.now // MINUTE + 1) * MINUTE + 1
    (fire,) = scheduler.fire_due(spec)
    assert (fire.cause, fire.skipped) == ("schedule", 0)


def test_an_attempt_the_fence_refuses_counts_as_a_duplicate(
    scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock, sqlite_url: str
) -> None:
    spec = declare(sched_broker, "raced", every(seconds=60))
    other = Scheduler(sched_broker, make_engine(sqlite_url), clock=clock, owner="other:1")
    scheduler.fire_due(spec)
    clock.now = (clock.now // MINUTE + 1) * MINUTE + 1
    tick = clock.now - 1
    (fired,) = scheduler.fire_due(spec)
    # When the other scheduler acts on a plan it read before that fire committed (the race the
    # fence settles), its attempt at the same tick is refused and counted on the fire row
    assert other._fire(spec, tick, clock.now, None) is None
    assert other._fire(spec, tick, clock.now, None) is None
    (row,) = scheduler.fires("raced")
    assert (row.fire_time, row.fired_by, row.duplicates) == (tick, fired.fired_by, 2)
    # And a refused attempt at a tick nobody fired (before the anchor) counts nothing anywhere
    assert other._fire(spec, tick - MINUTE, clock.now, None) is None
    assert [f.duplicates for f in scheduler.fires("raced")] == [2]
    other.engine.dispose()


def test_paused_schedules_have_no_next_fire(scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock) -> None:
    declare(sched_broker, "nightly", cron("0 3 * * *", jitter_s=600))
    scheduler.refresh()
    view = {v.name: v for v in scheduler.list()}["nightly"]
    assert view.next_fire_ms == 1_714_618_800_000  # 2024-05-02T03:00Z
    assert 0 <= view.jitter_offset_ms < 600_000 and view.catchup == "latest" and view.jitter_s == 600
    scheduler.pause("nightly", by="alice")
    assert {v.name: v for v in scheduler.list()}["nightly"].next_fire_ms is None
    scheduler.refresh()  # the stored view (the resync writes it) says the same
    with scheduler.engine.connect() as conn:
        assert schedule_get(conn, "nightly").next_fire_ms is None  # type: ignore[union-attr]
    scheduler.resume("nightly")
    assert {v.name: v for v in scheduler.list()}["nightly"].next_fire_ms == 1_714_618_800_000


def test_history_keeps_the_newest_fires_of_each_schedule(
    scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock
) -> None:
    fast = declare(sched_broker, "fast", every(seconds=1, catchup="all", grace_s=60))
    declare(sched_broker, "idle", cron("0 3 * * *"))
    scheduler.fire_due(fast)
    clock.now = (clock.now // 1000 + 5) * 1000 + 1
    assert len(scheduler.fire_due(fast)) == 5
    scheduler.run_now("idle", by="bob")
    history = scheduler.history(per_schedule=3)
    assert [f.fire_time for f in history["fast"]] == [clock.now - 1 - i * 1000 for i in range(3)]
    assert [(f.cause, f.fired_by) for f in history["idle"]] == [("manual", "bob")]


@pytest.mark.services
def test_outcomes_on_postgresql_with_a_redis_broker(tmp_path: Path, clock: Clock) -> None:
    """The row lock (``FOR UPDATE``), the duplicate count and the per-schedule history query on PostgreSQL."""
    from dramatiq.brokers.redis import RedisBroker

    with postgres_database(migrated=True) as url:
        broker = RedisBroker(url=REDIS_URL, namespace=f"tenure-test-{uuid.uuid4().hex[:8]}", middleware=[])
        install(broker)
        engine = make_engine(url)
        scheduler = configure(broker, engine=engine, clock=clock)
        other = Scheduler(broker, engine, clock=clock, owner="other:1")
        try:
            spec = declare(broker, "pg_hourly", cron("0 * * * *", grace_s=4 * 3600))
            scheduler.fire_due(spec)
            clock.now = H13 + 3 * 3600 * 1000 + 20 * MINUTE  # 16:20, nothing ran since the anchor at 12:00:37
            (fire,) = scheduler.fire_due(spec)
            assert (fire.cause, fire.skipped, fire.skipped_from) == ("catchup", 3, H13)
            assert other._fire(spec, fire.fire_time, clock.now, None) is None
            assert [(f.fire_time, f.duplicates, f.skipped) for f in scheduler.history(5)["pg_hourly"]] == [
                (fire.fire_time, 1, 3)
            ]
        finally:
            broker.flush_all()
            broker.close()
            engine.dispose()
