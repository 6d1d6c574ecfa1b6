"""Admission's gauges from the job database: what waits per queue and reason, each limit's use."""

from __future__ import annotations

from pathlib import Path

from jobs.limits import ConcurrencyLimit
from monitoring.collectors import JobsSource
from tests.integration.jobs.support import job_env

from .test_collectors import scrape


def test_waiting_jobs_and_a_limits_use_are_scraped(tmp_path: Path) -> None:
    with job_env("sqlite", tmp_path) as env:
        env.declare("capped", lambda ctx: None, concurrency=ConcurrencyLimit("capped.owner", limit=1))
        first = env.submit("capped").id
        for _ in range(3):
            env.submit("capped")
        env.submit("capped", owner_id="u2")
        assert env.claim(first) is not None
        samples = scrape(JobsSource.for_engine(env.engine))
    assert samples[("tenure_jobs_waiting", (("queue", "default"), ("reason", "concurrency")))] == 3
    labels = (("limit", "capped.owner"), ("type", "concurrency"))
    assert samples[("tenure_limit_in_use", labels)] == 1
    assert samples[("tenure_limit_waiting", labels)] == 3
    assert samples[("tenure_limit_keys_at_limit", labels)] == 1
