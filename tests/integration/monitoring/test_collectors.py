"""The scrape-time collector against a real SQLite broker file."""

from __future__ import annotations

from collections.abc import Iterator

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import current_millis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker import SQLiteBroker
from monitoring.collectors import (
    BrokerSource,
    DatabaseCollector,
    JobsSource,
    OutboxBacklog,
    ScheduleFireInfo,
    ScheduleSource,
    default_sources,
)


@pytest.fixture()
def broker(sqlite_url: str) -> Iterator[SQLiteBroker]:
    b = SQLiteBroker(sqlite_url, middleware=[], lease_ttl_ms=3_000)
    yield b
    b.close()


def scrape(*sources) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(DatabaseCollector(list(sources)))
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def msg(queue: str, actor: str = "work") -> dramatiq.Message:
    return dramatiq.Message(queue_name=queue, actor_name=actor, args=(), kwargs={}, options={})


def test_queue_states_lag_expired_leases_and_consumers(broker: SQLiteBroker) -> None:
    # Given: on queue "q": 3 due messages (one 5 s overdue), 1 delayed, 1 leased with an expired
    # lease, 1 dead; an empty paused queue "p"
    for name in ("q", "p"):
        broker.declare_queue(name)
    for _ in range(5):
        broker.enqueue(msg("q"))
    broker.enqueue(msg("q"), delay=60_000)
    consumer = broker.consume("q", prefetch=2)
    first = next(consumer)
    second = next(consumer)
    assert first is not None and second is not None
    now = current_millis()
    with broker.store.write() as conn:
        conn.execute("UPDATE broker_messages SET lease_expires = ? WHERE id = ?", (now - 1_000, first._row_id))
        conn.execute(
            "UPDATE broker_messages SET state = 2, lease_owner = NULL, lease_expires = NULL, dead_at = ? WHERE id = ?",
            (now, second._row_id),
        )
        conn.execute(
            "UPDATE broker_messages SET eta = ? WHERE id = (SELECT min(id) FROM broker_messages WHERE state = 0)",
            (now - 5_000,),
        )
    broker.pause("p")

    # When
    samples = scrape(BrokerSource(broker))

    # Then
    def v(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert v("tenure_queue_messages", queue="q", state="ready") == 3
    assert v("tenure_queue_messages", queue="q", state="delayed") == 1
    assert v("tenure_queue_messages", queue="q", state="leased") == 1
    assert v("tenure_queue_messages", queue="q", state="dead") == 1
    assert 5.0 <= v("tenure_queue_oldest_ready_age_seconds", queue="q") < 30
    assert v("tenure_leases_expired_unreaped", queue="q") == 1
    assert v("tenure_queue_consumers", queue="q") == 1
    assert v("tenure_queue_paused", queue="p") == 1
    assert v("tenure_queue_paused", queue="q") == 0
    assert v("tenure_queue_messages", queue="p", state="ready") == 0
    assert v("tenure_queue_oldest_ready_age_seconds", queue="p") == 0
    assert v("tenure_collector_source_up", source="broker") == 1

    # And: once reaped, the expired lease is ready again and no longer counted
    assert broker.reap() == 1
    samples = scrape(BrokerSource(broker))
    assert v("tenure_leases_expired_unreaped", queue="q") == 0
    assert v("tenure_queue_messages", queue="q", state="ready") == 4
    consumer.close()


def test_a_lease_that_just_has_not_expired_is_not_counted(broker: SQLiteBroker) -> None:
    broker.declare_queue("q")
    broker.enqueue(msg("q"))
    consumer = broker.consume("q", prefetch=1)
    delivered = next(consumer)
    assert delivered is not None
    clock_ms = current_millis()
    with broker.store.write() as conn:
        conn.execute("UPDATE broker_messages SET lease_expires = ? WHERE id = ?", (clock_ms, delivered._row_id))
    at_expiry = scrape(BrokerSource(broker, clock=lambda: clock_ms))
    just_after = scrape(BrokerSource(broker, clock=lambda: clock_ms + 1))
    key = ("tenure_leases_expired_unreaped", (("queue", "q"),))
    assert at_expiry[key] == 0
    assert just_after[key] == 1
    consumer.close()


def test_non_sqlite_broker_yields_nothing_but_the_source_is_up() -> None:
    samples = scrape(BrokerSource(StubBroker(middleware=[])))
    assert samples[("tenure_collector_source_up", (("source", "broker"),))] == 1
    assert not any(name == "tenure_queue_messages" for name, _ in samples)


def test_a_failing_source_is_reported_and_the_others_still_answer(broker: SQLiteBroker) -> None:
    def boom() -> dict[str, int]:
        raise RuntimeError("jobs table missing")

    broker.declare_queue("q")
    broker.enqueue(msg("q"))
    samples = scrape(*default_sources(broker, jobs=JobsSource(status_counts=boom)))
    assert samples[("tenure_collector_source_up", (("source", "jobs"),))] == 0
    assert samples[("tenure_collector_source_up", (("source", "broker"),))] == 1
    assert samples[("tenure_queue_messages", (("queue", "q"), ("state", "ready")))] == 1


def test_jobs_and_schedule_sources() -> None:
    jobs = JobsSource(
        status_counts=lambda: {"running": 2, "succeeded": 7},
        outbox_backlog=lambda: OutboxBacklog(rows=3, oldest_age_s=1.5),
    )
    schedules = ScheduleSource(
        lambda: [ScheduleFireInfo("resync", 1_700_000_000.0, 1_700_000_030.0), ScheduleFireInfo("nightly", None, 2e9)]
    )
    samples = scrape(jobs, schedules)
    assert samples[("tenure_jobs", (("status", "running"),))] == 2
    assert samples[("tenure_jobs", (("status", "succeeded"),))] == 7
    assert samples[("tenure_jobs", (("status", "queued"),))] == 0  # always exported
    assert samples[("tenure_outbox_backlog", ())] == 3
    assert samples[("tenure_outbox_oldest_age_seconds", ())] == 1.5
    assert samples[("tenure_schedule_last_fire_timestamp_seconds", (("schedule", "resync"),))] == 1_700_000_000.0
    assert samples[("tenure_schedule_next_fire_timestamp_seconds", (("schedule", "nightly"),))] == 2e9
    assert ("tenure_schedule_last_fire_timestamp_seconds", (("schedule", "nightly"),)) not in samples


def test_jobs_source_without_callables_yields_nothing() -> None:
    samples = scrape(JobsSource())
    assert [name for name, _ in samples] == ["tenure_collector_source_up", "tenure_collector_source_duration_seconds"]
