"""Real ``periodiq`` processes on one database: every tick fires once, even when one is SIGKILLed."""

from __future__ import annotations

import json

import pytest

from .conftest import Fleet

TICKS = 20


def fired(fleet: Fleet, schedule: str = "tick") -> list[tuple[int, str, str]]:
    return fleet.query(
        "SELECT fire_time, coalesce(message_id, job_id), fired_by FROM schedule_fires WHERE schedule = ? ORDER BY 1",
        schedule,
    )


def assert_consecutive(times: list[int]) -> None:
    """One-second ticks with none missing and none twice."""
    assert times == list(range(times[0], times[0] + 1000 * len(times), 1000))


def assert_each_tick_once(fleet: Fleet) -> list[tuple[int, str, str]]:
    fires = fired(fleet)
    times = [f[0] for f in fires]
    assert_consecutive(times)
    bodies = fleet.query("SELECT message_id, body FROM broker_messages WHERE actor = 'tick'")
    assert len(bodies) == len(fires)
    assert {m for m, _ in bodies} == {f[1] for f in fires}
    ticks_in_messages = sorted(json.loads(b)["options"]["tenure_schedule"]["fire_time"] for _, b in bodies)
    assert ticks_in_messages == times
    (created_at,) = fleet.query("SELECT created_at FROM schedules WHERE name = 'tick'")[0]
    assert times[0] > created_at  # nothing fired because a process started
    return fires


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_two_schedulers_fire_twenty_ticks_as_exactly_twenty_jobs(fleet: Fleet) -> None:
    # Given two periodiq processes and a one-second schedule that submits a job per tick
    fleet.scheduler("scheduler.1", "tick_jobs")
    fleet.scheduler("scheduler.2", "tick_jobs")
    # When twenty ticks have fired
    fleet.wait(lambda: len(fired(fleet, "tick_jobs")) >= TICKS, 60, f"{TICKS} fires")
    fleet.stop()
    # Then each tick fired once and made exactly one job, with one message each
    fires = fired(fleet, "tick_jobs")
    assert_consecutive([f[0] for f in fires])
    jobs = fleet.query("SELECT id, idempotency_key FROM jobs WHERE kind = 'tick_job'")
    assert len(jobs) == len(fires) >= TICKS
    assert {j[0] for j in jobs} == {f[1] for f in fires}
    assert len({j[1] for j in jobs}) == len(jobs)
    assert len(fleet.query("SELECT 1 FROM broker_messages WHERE actor = 'tick_job'")) == len(jobs)
    (created_at,) = fleet.query("SELECT created_at FROM schedules WHERE name = 'tick_jobs'")[0]
    assert fires[0][0] > created_at  # nothing fired because a process started


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_sigkill_of_one_scheduler_loses_and_duplicates_nothing(fleet: Fleet) -> None:
    procs = [fleet.scheduler("scheduler.1", "tick"), fleet.scheduler("scheduler.2", "tick")]
    fleet.wait(lambda: len(fired(fleet)) >= 5, 60, "5 fires")
    # When the process that fired the latest tick is SIGKILLed mid-run
    latest_pid = int(fired(fleet)[-1][2].rsplit(":", 1)[1])
    victim = next(p for p in procs if p.pid == latest_pid)
    fleet.kill(victim)
    killed_at = fired(fleet)[-1][0]
    # Then the survivor goes on: no tick is missing and none fired twice
    fleet.wait(lambda: len(fired(fleet)) >= TICKS, 60, f"{TICKS} fires")
    fleet.stop()
    fires = assert_each_tick_once(fleet)
    after = [f for f in fires if f[0] > killed_at]
    assert after and all(int(f[2].rsplit(":", 1)[1]) != latest_pid for f in after)
