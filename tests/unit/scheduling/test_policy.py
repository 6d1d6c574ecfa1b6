"""Catch-up policy and jitter: which ticks fire, given the fence and an injected "now"."""

from __future__ import annotations

from datetime import UTC, datetime

from tasks.scheduling import cron, every
from tasks.scheduling.cronmath import to_ms
from tasks.scheduling.specs import MAX_CATCHUP_FIRES, Binding


def ms(*args: int) -> int:
    return to_ms(datetime(*args, tzinfo=UTC))


def test_start_inside_a_matching_minute_fires_nothing() -> None:
    # The schedule became known at 12:00:37 (its anchor); the 12:00:00 tick was never owed.
    spec = cron("* * * * *")
    anchor = ms(2024, 5, 1, 12, 0, 37)
    assert spec.plan(lower_ms=anchor, now_ms=anchor) == []
    assert spec.plan(lower_ms=anchor, now_ms=anchor + 22_000) == []
    assert spec.plan(lower_ms=anchor, now_ms=ms(2024, 5, 1, 12, 1, 0)) == [ms(2024, 5, 1, 12, 1, 0)]


def test_latest_fires_the_most_recent_missed_tick_once_within_grace() -> None:
    spec = cron("0 3 * * *", grace_s=6 * 3600)
    last = ms(2024, 5, 1, 3, 0)
    # Down from 2024-05-01 04:00 to 2024-05-03 05:00: two ticks missed, only the latest fires.
    assert spec.plan(lower_ms=last, now_ms=ms(2024, 5, 3, 5, 0)) == [ms(2024, 5, 3, 3, 0)]


def test_latest_outside_grace_fires_nothing() -> None:
    spec = cron("0 3 * * *", grace_s=3600)
    assert spec.plan(lower_ms=ms(2024, 5, 1, 3, 0), now_ms=ms(2024, 5, 3, 5, 0)) == []
    # Both sides of the boundary: exactly grace old fires, one ms older does not.
    tick = ms(2024, 5, 3, 3, 0)
    assert spec.plan(lower_ms=ms(2024, 5, 1, 3, 0), now_ms=tick + 3_600_000) == [tick]
    assert spec.plan(lower_ms=ms(2024, 5, 1, 3, 0), now_ms=tick + 3_600_001) == []


def test_all_fires_every_missed_tick_in_order_capped() -> None:
    spec = every(seconds=10, catchup="all", grace_s=60)
    assert spec.plan(lower_ms=0, now_ms=45_000) == [10_000, 20_000, 30_000, 40_000]
    # Older than the grace window never fires.
    assert spec.plan(lower_ms=0, now_ms=200_000) == [140_000, 150_000, 160_000, 170_000, 180_000, 190_000, 200_000]
    big = every(seconds=1, catchup="all", grace_s=3600)
    assert len(big.plan(lower_ms=0, now_ms=3_000_000)) == MAX_CATCHUP_FIRES


def test_none_fires_only_on_time_ticks() -> None:
    spec = every(seconds=60, catchup="none")
    assert spec.plan(lower_ms=0, now_ms=62_000) == [60_000]  # a late wake is still on time
    assert spec.plan(lower_ms=0, now_ms=90_000) == []  # missed during downtime: dropped


def test_nothing_at_or_before_the_fence_fires() -> None:
    spec = every(seconds=10, catchup="all")
    assert spec.plan(lower_ms=30_000, now_ms=30_000) == []
    assert spec.plan(lower_ms=30_000, now_ms=40_000) == [40_000]


def test_jitter_is_deterministic_per_schedule_and_bounded() -> None:
    def bound(spec, name: str):  # type: ignore[no-untyped-def]
        spec.bind(Binding(name, "default", lambda: None))  # type: ignore[arg-type,return-value]
        return spec

    a1 = bound(cron("0 3 * * *", jitter_s=600), "report_a")
    a2 = bound(cron("0 3 * * *", jitter_s=600), "report_a")
    b = bound(cron("0 3 * * *", jitter_s=600), "report_b")
    assert a1.jitter_ms() == a2.jitter_ms()
    assert 0 <= a1.jitter_ms() < 600_000 and 0 <= b.jitter_ms() < 600_000
    assert a1.jitter_ms() != b.jitter_ms()
    assert bound(cron("0 3 * * *"), "plain").jitter_ms() == 0
