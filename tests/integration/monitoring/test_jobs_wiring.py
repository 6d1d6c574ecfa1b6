"""Monitoring wired to the real job layer: jobs per status, outbox backlog, database-at-head check."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from jobs import JobStatus, make_engine
from jobs.schema import upgrade
from monitoring.collectors import DatabaseCollector, JobsSource
from monitoring.health import database_at_head_check, ready


@pytest.fixture()
def database(tmp_path: Path) -> Iterator[tuple[str, Engine]]:
    url = f"sqlite:///{tmp_path / 'tenure.db'}"
    engine = make_engine(url)
    yield url, engine
    engine.dispose()


def scrape(collector: DatabaseCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples
    }


def test_jobs_source_and_health_before_and_after_migration(database: tuple[str, Engine]) -> None:
    url, engine = database
    collector = DatabaseCollector([JobsSource.for_engine(engine)])
    check = {"database": database_at_head_check(engine)}

    # Given: a database not migrated yet → the source is down, the readiness check fails
    before = scrape(collector)
    assert before[("tenure_collector_source_up", (("source", "jobs"),))] == 0
    assert not any(name == "tenure_jobs" for name, _ in before)
    report = ready(check)
    assert not report.ok and "tenure db upgrade" in (report.components[0].detail or "")

    # When: migrated
    head = upgrade(url)

    # Then: every status is exported (0 jobs), the outbox backlog too, and the database is ready at head
    after = scrape(collector)
    assert after[("tenure_collector_source_up", (("source", "jobs"),))] == 1
    assert {dict(k)["status"] for name, k in after if name == "tenure_jobs"} == {s.value for s in JobStatus}
    assert all(v == 0 for (name, _), v in after.items() if name == "tenure_jobs")
    assert after[("tenure_outbox_backlog", ())] == 0
    report = ready(check)
    assert report.ok and report.components[0].detail == head
