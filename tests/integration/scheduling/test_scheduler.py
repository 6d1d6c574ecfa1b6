"""The scheduler on a real SQLite file with an injected clock: fences, catch-up, pause, run-now."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import dramatiq
import pytest
from dramatiq.middleware import Middleware, MiddlewareError

from broker import SQLiteBroker
from jobs.db import make_engine
from tasks.scheduling import MESSAGE_OPTION, ScheduleNotFound, Scheduler, cron, every

from .conftest import Clock, messages

MINUTE = 60_000


def declare(broker: SQLiteBroker, name: str, spec):  # type: ignore[no-untyped-def]
    def fn() -> None:
        pass

    return dramatiq.actor(fn, actor_name=name, queue_name="sched", broker=broker, periodic=spec)


def test_first_start_inside_a_matching_minute_fires_nothing(
    scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock, sqlite_path: Path
) -> None:
    actor = declare(sched_broker, "minutely", cron("* * * * *"))
    spec = actor.options["periodic"]
    # Given a scheduler starting at 12:00:37, inside a minute that matches
    assert scheduler.fire_due(spec) == []
    assert messages(sqlite_path, "minutely") == []
    # Then the next minute fires once, on time
    clock.now = 1_714_564_860_000 + 3  # 12:01:00.003
    fired = scheduler.fire_due(spec)
    assert [(f.fire_time, f.cause) for f in fired] == [(1_714_564_860_000, "schedule")]
    assert scheduler.fire_due(spec) == []
    assert len(messages(sqlite_path, "minutely")) == 1


def test_competing_schedulers_fire_each_tick_once(
    scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock, sqlite_url: str, sqlite_path: Path
) -> None:
    actor = declare(sched_broker, "fast", every(seconds=1, catchup="all", grace_s=30))
    spec = actor.options["periodic"]
    others = [Scheduler(sched_broker, make_engine(sqlite_url), clock=clock) for _ in range(3)]
    everyone = [scheduler, *others]
    scheduler.fire_due(spec)  # anchor
    fired: list[int] = []
    lock = threading.Lock()

    def wake(s: Scheduler, now: int) -> None:
        for f in s.fire_due(spec, now):
            with lock:
                fired.append(f.fire_time)

    # When four schedulers wake together at each of 20 ticks
    for i in range(1, 21):
        clock.now = (clock.now // 1000 + 1) * 1000 + 2
        threads = [threading.Thread(target=wake, args=(s, clock.now)) for s in everyone]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(fired) == i
    # Then 20 ticks, 20 fire rows, 20 messages, no duplicate
    assert len(set(fired)) == 20
    assert len(messages(sqlite_path, "fast")) == 20
    assert len(scheduler.fires("fast", limit=100)) == 20
    for s in others:
        s.engine.dispose()


def test_catch_up_after_downtime_fires_the_latest_tick_once(
    scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock, sqlite_path: Path
) -> None:
    hourly = declare(sched_broker, "hourly", cron("0 * * * *", grace_s=3600)).options["periodic"]
    strict = declare(sched_broker, "strict", cron("0 * * * *", grace_s=600)).options["periodic"]
    scheduler.fire_due(hourly)
    scheduler.fire_due(strict)
    clock.now = 1_714_568_400_000  # 13:00:00 on time
    assert len(scheduler.fire_due(hourly)) == len(scheduler.fire_due(strict)) == 1
    # Given every scheduler down from 13:00:01 to 16:20
    clock.now = 1_714_580_400_000  # 16:20:00
    # Then the 16:00 tick (inside its hour of grace) fires once as a catch-up, 14:00 and 15:00 never
    fired = scheduler.fire_due(hourly)
    assert [(f.fire_time, f.cause) for f in fired] == [(1_714_579_200_000, "catchup")]
    # And a schedule whose grace is ten minutes skips it
    assert scheduler.fire_due(strict) == []
    # And a restarted scheduler (new process state) does not fire it again
    clock.now += 1_000
    fresh = Scheduler(sched_broker, scheduler.engine, clock=clock)
    assert fresh.fire_due(hourly) == []
    assert len(messages(sqlite_path, "hourly")) == 2


def test_pause_skips_ticks_and_resume_does_not_replay_them(
    scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock, sqlite_path: Path
) -> None:
    spec = declare(sched_broker, "paused", every(seconds=60, catchup="all")).options["periodic"]
    scheduler.fire_due(spec)
    assert scheduler.pause("paused", by="alice") is True
    assert scheduler.pause("paused") is False
    clock.now += 5 * MINUTE
    assert scheduler.fire_due(spec) == []
    view = {v.name: v for v in scheduler.list()}["paused"]
    assert view.paused and view.paused_by == "alice"
    assert scheduler.resume("paused") is True
    clock.now += 1_000
    assert scheduler.fire_due(spec) == []  # ticks missed while paused never fire
    clock.now = (clock.now // MINUTE + 1) * MINUTE + 1
    assert len(scheduler.fire_due(spec)) == 1
    with pytest.raises(ScheduleNotFound):
        scheduler.pause("nope")


def test_run_now_fires_once_even_while_paused_and_leaves_the_fence(
    scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock, sqlite_path: Path
) -> None:
    spec = declare(sched_broker, "manual", cron("0 3 * * *")).options["periodic"]
    scheduler.pause("manual")
    clock.now = 1_714_564_860_000  # a whole second: manual keys never take a tick's key
    first = scheduler.run_now("manual", by="bob")
    second = scheduler.run_now("manual", by="bob")
    assert first.cause == second.cause == "manual" and first.fired_by == "bob"
    assert first.fire_time % 1000 and second.fire_time % 1000 and first.fire_time != second.fire_time
    rows = messages(sqlite_path, "manual")
    assert [r[0] for r in rows] == [first.message_id, second.message_id]
    view = {v.name: v for v in scheduler.list()}["manual"]
    assert view.last_fire_ms is None and view.paused
    assert spec.describe() == "cron 0 3 * * * UTC"


def test_a_failed_enqueue_leaves_no_fire_and_the_tick_fires_later(
    scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock, sqlite_path: Path
) -> None:
    class FailOnce(Middleware):
        failed = False

        def before_enqueue(self, broker, message, delay):  # type: ignore[no-untyped-def]
            if not self.failed:
                self.failed = True
                raise MiddlewareError("broker hiccup")  # what Dramatiq lets through enqueue

    spec = declare(sched_broker, "atomic", every(seconds=10)).options["periodic"]
    scheduler.fire_due(spec)
    sched_broker.add_middleware(FailOnce())
    clock.now = (clock.now // 10_000 + 1) * 10_000
    with pytest.raises(MiddlewareError):
        scheduler.fire_due(spec)
    assert scheduler.fires("atomic") == [] and messages(sqlite_path, "atomic") == []
    # The next wake fires the same tick (the fence did not move)
    fired = scheduler.fire_due(spec)
    assert [f.fire_time for f in fired] == [clock.now]
    assert len(messages(sqlite_path, "atomic")) == 1


def test_jitter_delays_delivery_but_keeps_the_nominal_key(
    scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock, sqlite_path: Path
) -> None:
    spec = declare(sched_broker, "jittered", every(seconds=60, jitter_s=30)).options["periodic"]
    scheduler.fire_due(spec)
    clock.now = (clock.now // MINUTE + 1) * MINUTE
    (fire,) = scheduler.fire_due(spec)
    assert fire.fire_time == clock.now and fire.due_at == clock.now + spec.jitter_ms()
    ((message_id, eta),) = messages(sqlite_path, "jittered")
    assert message_id == fire.message_id
    # The broker's eta is its own wall clock + delay; the delay is exactly the jitter here.
    with sqlite3.connect(sqlite_path) as conn:
        enqueued_at, body = conn.execute("SELECT enqueued_at, body FROM broker_messages").fetchone()
    assert eta - enqueued_at == spec.jitter_ms()
    info = json.loads(body)["options"][MESSAGE_OPTION]
    assert info == {"name": "jittered", "fire_time": fire.fire_time, "due_at": fire.due_at, "cause": "schedule"}


def test_prune_keeps_each_schedules_latest_fire(scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock) -> None:
    spec = declare(sched_broker, "pruned", every(seconds=60, catchup="all")).options["periodic"]
    rare = declare(sched_broker, "rare", every(seconds=60)).options["periodic"]
    scheduler.fire_due(spec)
    scheduler.fire_due(rare)
    clock.now = (clock.now // MINUTE + 1) * MINUTE
    scheduler.fire_due(rare)
    for _ in range(5):
        scheduler.fire_due(spec)
        clock.now += MINUTE
    assert len(scheduler.fires("pruned")) == 5
    deleted = scheduler.prune_fires(retention_s=150)
    assert deleted == 3  # pruned: the three ticks older than 150 s; rare's only fire is its latest
    assert len(scheduler.fires("pruned")) == 2 and len(scheduler.fires("rare")) == 1
    assert scheduler.prune_fires(retention_s=0) == 1
    assert len(scheduler.fires("pruned")) == 1


def test_refresh_writes_the_view(scheduler: Scheduler, sched_broker: SQLiteBroker, clock: Clock) -> None:
    declare(sched_broker, "viewed", cron("30 2 * * *", tz="Europe/Paris"))
    assert scheduler.refresh() == 1
    (view,) = [v for v in scheduler.list() if v.name == "viewed"]
    assert view.spec == "cron 30 2 * * * Europe/Paris" and view.next_fire_ms and view.declared
    assert view.actor_name == "viewed" and view.queue_name == "sched"
