"""Schedule math: Sunday, @weekly, DST in real zones, epoch-aligned intervals."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import periodiq
import pytest

from tasks.scheduling import cron, every
from tasks.scheduling.cronmath import from_ms, to_ms
from tasks.scheduling.specs import CronSchedule, as_schedule

PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")


def local_ticks(spec: CronSchedule, start: datetime, end: datetime) -> list[datetime]:
    """Every tick of *spec* in (start, end], as datetimes in the schedule's zone."""
    return [from_ms(t, spec.zone) for t in spec.ticks(to_ms(start), to_ms(end), limit=10_000)]


@pytest.mark.parametrize("expr", ["0 0 * * 0", "0 0 * * 7", "0 0 * * sun", "0 0 * * SUN", "@weekly"])
def test_sunday_is_0_and_7_and_weekly_fires_every_sunday(expr: str) -> None:
    spec = cron(expr, tz="Europe/Paris")
    # Given three weeks starting on a Wednesday (periodiq fired @weekly 0 times here)
    ticks = local_ticks(spec, datetime(2024, 10, 2, tzinfo=PARIS), datetime(2024, 10, 23, tzinfo=PARIS))
    assert [t.date().isoformat() for t in ticks] == ["2024-10-06", "2024-10-13", "2024-10-20"]
    assert all(t.strftime("%a %H:%M") == "Sun 00:00" for t in ticks)


def test_first_sunday_is_not_skipped_when_starting_on_saturday() -> None:
    spec = cron("0 0 * * 7", tz="UTC")
    ticks = local_ticks(spec, datetime(2024, 10, 5, 12, tzinfo=UTC), datetime(2024, 10, 7, tzinfo=UTC))
    assert [t.isoformat() for t in ticks] == ["2024-10-06T00:00:00+00:00"]


def test_spring_forward_fixed_time_runs_once_at_the_first_valid_minute() -> None:
    # 2024-03-31 in Paris: 02:00 → 03:00. 02:30 does not exist that day.
    spec = cron("30 2 * * *", tz="Europe/Paris")
    ticks = local_ticks(spec, datetime(2024, 3, 30, 12, tzinfo=PARIS), datetime(2024, 4, 1, 12, tzinfo=PARIS))
    assert [t.isoformat() for t in ticks] == ["2024-03-31T03:00:00+02:00", "2024-04-01T02:30:00+02:00"]


def test_fall_back_fixed_time_runs_once() -> None:
    # 2024-10-27 in Paris: 03:00 → 02:00, so 02:30 happens twice on the wall clock.
    spec = cron("30 2 * * *", tz="Europe/Paris")
    ticks = local_ticks(spec, datetime(2024, 10, 26, 12, tzinfo=PARIS), datetime(2024, 10, 28, 12, tzinfo=PARIS))
    assert [t.isoformat() for t in ticks] == ["2024-10-27T02:30:00+02:00", "2024-10-28T02:30:00+01:00"]


def test_fall_back_in_new_york_runs_once_and_spring_forward_runs_once() -> None:
    spec = cron("30 1 * * *", tz="America/New_York")
    fall = local_ticks(spec, datetime(2024, 11, 2, 12, tzinfo=NEW_YORK), datetime(2024, 11, 3, 23, tzinfo=NEW_YORK))
    assert [t.isoformat() for t in fall] == ["2024-11-03T01:30:00-04:00"]
    spring = cron("30 2 * * *", tz="America/New_York")
    ticks = local_ticks(spring, datetime(2024, 3, 9, 12, tzinfo=NEW_YORK), datetime(2024, 3, 10, 23, tzinfo=NEW_YORK))
    assert [t.isoformat() for t in ticks] == ["2024-03-10T03:00:00-04:00"]


def test_starting_inside_the_repeated_hour_does_not_fire_the_first_pass_again() -> None:
    spec = cron("30 2 * * *", tz="Europe/Paris")
    # 02:45 on the second pass (fold=1, UTC+1) is after the 02:30 first-pass tick.
    inside = datetime(2024, 10, 27, 2, 45, fold=1, tzinfo=PARIS)
    nxt = spec.next_tick(to_ms(inside))
    assert nxt is not None and from_ms(nxt, PARIS).isoformat() == "2024-10-28T02:30:00+01:00"


def test_hourly_follows_elapsed_time_across_dst() -> None:
    spec = cron("0 * * * *", tz="Europe/Paris")
    day = datetime(2024, 10, 27, tzinfo=PARIS)
    fall = local_ticks(spec, day, datetime(2024, 10, 28, tzinfo=PARIS))
    assert len(fall) == 25  # the repeated 02:00 is a real, distinct hour
    spring = local_ticks(spec, datetime(2024, 3, 31, tzinfo=PARIS), datetime(2024, 4, 1, tzinfo=PARIS))
    assert len(spring) == 23


def test_ticks_are_distinct_utc_instants() -> None:
    spec = cron("*/30 * * * *", tz="Europe/Paris")
    raw = spec.ticks(to_ms(datetime(2024, 10, 27, tzinfo=PARIS)), to_ms(datetime(2024, 10, 28, tzinfo=PARIS)), 10_000)
    assert len(raw) == len(set(raw)) == 50 and raw == sorted(raw)


def test_interval_ticks_are_epoch_aligned() -> None:
    spec = every(seconds=30)
    assert spec.ticks(1_000, 125_000, 100) == [30_000, 60_000, 90_000, 120_000]
    assert spec.next_tick(120_000) == 150_000
    assert spec.next_tick(119_999) == 120_000
    assert every(minutes=1, offset_s=15).ticks(0, 200_000, 100) == [15_000, 75_000, 135_000, 195_000]


def test_limit_keeps_the_latest_ticks() -> None:
    assert every(seconds=1).ticks(0, 10_000, 3) == [8_000, 9_000, 10_000]
    spec = cron("* * * * *", tz="UTC")
    assert spec.ticks(0, 600_000, 2) == [540_000, 600_000]


def test_periodiq_cron_objects_are_read_with_tenure_math() -> None:
    spec = as_schedule(periodiq.cron("@weekly"))
    assert isinstance(spec, CronSchedule)
    ticks = spec.ticks(to_ms(datetime(2024, 10, 2, tzinfo=UTC)), to_ms(datetime(2024, 10, 23, tzinfo=UTC)), 100)
    assert len(ticks) == 3


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: cron("61 * * * *"), "invalid cron"),
        (lambda: cron("* * * *"), "5 fields"),
        (lambda: cron("@fortnightly"), "unknown cron alias"),
        (lambda: cron("0 3 * * *", tz="Mars/Olympus"), "unknown time zone"),
        (lambda: cron("0 3 * * *", catchup="some"), "catchup"),  # type: ignore[arg-type]
        (lambda: cron("0 3 * * *", grace_s=0), "grace_s"),
        (lambda: every(seconds=0.5), "at least"),
        (lambda: every(seconds=10, offset_s=10), "offset"),
        (lambda: every(seconds=10, max_staleness_s=0), "max_staleness_s"),
    ],
)
def test_invalid_declarations_fail_when_declared(make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        make()
