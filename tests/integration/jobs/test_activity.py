"""Activity per bucket on both engines: nearest-rank percentiles (a p95 never above the slowest job) and the
breakdown by queue or kind."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

from jobs.queries import activity

from .support import JobEnv


def _ran(env: JobEnv, kind: str, *, end_ms: int, run_ms: int, wait_ms: int) -> None:
    """A job of *kind* that succeeded, having waited *wait_ms*, then run *run_ms* until *end_ms*."""
    job = env.submit(kind, payload={})
    ctx = env.claim(job.id)
    assert ctx is not None
    env.mw.runner(ctx)
    env.sql(
        "UPDATE jobs SET created_at = :c, started_at = :s, completed_at = :e WHERE id = :id",
        id=job.id,
        c=end_ms - run_ms - wait_ms,
        s=end_ms - run_ms,
        e=end_ms,
    )


def _finished(env: JobEnv, kind: str, run_s: list[int], end: datetime) -> None:
    """Jobs of *kind* that succeeded, each having run the given seconds and finished at *end*."""
    for seconds in run_s:
        _ran(env, kind, end_ms=round(end.timestamp() * 1000), run_ms=seconds * 1000, wait_ms=500)


def test_percentiles_are_nearest_rank_and_never_above_the_slowest(env: JobEnv) -> None:
    env.declare("few", lambda ctx: None)
    env.declare("many", lambda ctx: None, queue="bulk")
    now = datetime.now(UTC).replace(second=30, microsecond=0)
    # Given 3 jobs of 1, 2, 3 s (statistics.quantiles would say p95 = 3.8 s) and 20 of 1..20 s
    _finished(env, "few", [1, 2, 3], now - timedelta(minutes=5))
    _finished(env, "many", list(range(1, 21)), now - timedelta(minutes=5))

    # When the activity is read by kind and by queue
    since = now - timedelta(hours=1)
    by_kind = {a.group: a for a in activity(env.engine, since=since, bucket_s=3600, owner_id=None, is_admin=True,
                                             until=now, group_by="kind") if a.succeeded}  # fmt: skip
    by_queue = {a.group for a in activity(env.engine, since=since, bucket_s=3600, owner_id=None, is_admin=True,
                                          until=now, group_by="queue") if a.succeeded}  # fmt: skip
    [everything] = [a for a in activity(env.engine, since=since, bucket_s=3600, owner_id=None, is_admin=True,
                                        until=now) if a.succeeded]  # fmt: skip

    # Then each p95 is one of the run times (rank ceil(0.95 n)), never above the max
    assert (by_kind["few"].run_p50_s, by_kind["few"].run_p95_s, by_kind["few"].run_max_s) == (2.0, 3.0, 3.0)
    assert (by_kind["many"].run_p50_s, by_kind["many"].run_p95_s, by_kind["many"].run_max_s) == (10.0, 19.0, 20.0)
    assert by_kind["few"].wait_p50_s == 0.5 and by_kind["few"].succeeded == 3
    assert by_queue == {"default", "bulk"}
    assert everything.succeeded == 23 and everything.run_p95_s is not None
    assert everything.run_p95_s <= everything.run_max_s == 20.0


def _nearest_rank(values: list[int], p: float) -> float:
    """The value at rank ceil(p·n) of *values* sorted, in seconds: the definition the chart promises."""
    ranked = sorted(values)
    return ranked[math.ceil(p * len(ranked)) - 1] / 1000


def test_every_bucket_and_group_has_the_nearest_rank_percentiles_of_its_own_jobs(env: JobEnv) -> None:
    env.declare("a", lambda ctx: None)
    env.declare("b", lambda ctx: None, queue="bulk")
    now = datetime.now(UTC).replace(second=30, microsecond=0)
    since = now - timedelta(minutes=4)
    base_ms = round(since.replace(second=0).timestamp() * 1000)
    rng = random.Random(14)
    # Given 90 jobs that ran, with ties, spread over 3 one-minute buckets and 2 kinds, and 6 cancelled before
    # they started (counted, but without durations)
    expected: dict[tuple[int, str], tuple[list[int], list[int]]] = {}
    for _ in range(90):
        kind, bucket = rng.choice("ab"), rng.randrange(3)
        wait_ms, run_ms = rng.randrange(0, 400, 20), rng.randrange(100, 9000, 100)
        _ran(env, kind, end_ms=base_ms + bucket * 60_000 + rng.randrange(60_000), run_ms=run_ms, wait_ms=wait_ms)
        waits, runs = expected.setdefault((bucket, kind), ([], []))
        waits.append(wait_ms)
        runs.append(run_ms)
    for i in range(6):
        job = env.submit("a", payload={})
        env.sql(
            "UPDATE jobs SET status = 'cancelled', completed_at = :e WHERE id = :id",
            id=job.id,
            e=base_ms + (i % 3) * 60_000 + 30_000,
        )

    # When the activity is read per minute and kind
    rows = activity(env.engine, since=since, bucket_s=60, owner_id=None, is_admin=True, until=now, group_by="kind")

    # Then every (bucket, kind) holds exactly its own jobs' percentiles
    got = {(round((r.start - since.replace(second=0)).total_seconds()) // 60, r.group): r for r in rows}
    assert sum(r.cancelled for r in rows) == 6
    for (bucket, kind), (waits, runs) in expected.items():
        r = got[(bucket, kind)]
        assert r.succeeded == len(runs), (bucket, kind)
        assert (r.wait_p50_s, r.run_p50_s, r.run_p95_s, r.run_max_s) == (
            _nearest_rank(waits, 0.5),
            _nearest_rank(runs, 0.5),
            _nearest_rank(runs, 0.95),
            max(runs) / 1000,
        ), (bucket, kind)
