"""MetricsMiddleware with a real Dramatiq Worker on SQLite, Redis and RabbitMQ (one contract)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import Middleware, SkipMessage

import monitoring.metrics as m
from broker import SQLiteBroker
from monitoring.middleware import MetricsMiddleware

#: How long to wait for a metric to reach its expected value, in seconds.
WAIT_S = 20.0


def value(name: str, **labels: str) -> float:
    return m.REGISTRY.get_sample_value(name, labels) or 0.0


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class SkipActor(Middleware):
    """Skips every message of one actor (runs after MetricsMiddleware's before_process_message)."""

    def __init__(self, actor_name: str) -> None:
        self.actor_name = actor_name

    def before_process_message(self, broker: Any, message: Any) -> None:
        if message.actor_name == self.actor_name:
            raise SkipMessage("skipped by test")


def make_sqlite(sqlite_url: str, request: pytest.FixtureRequest) -> dramatiq.Broker:
    return SQLiteBroker(sqlite_url, lease_ttl_ms=3_000)


def make_redis(redis_url: str, request: pytest.FixtureRequest) -> dramatiq.Broker:
    pytest.importorskip("redis")
    from dramatiq.brokers.redis import RedisBroker

    b = RedisBroker(url=redis_url, namespace=f"tenure-test-{uuid.uuid4().hex[:8]}")
    try:
        b.client.ping()
    except Exception as e:
        pytest.skip(f"Redis not reachable: {e}")
    return b


def make_rabbitmq(rabbitmq_url: str, request: pytest.FixtureRequest) -> dramatiq.Broker:
    pytest.importorskip("pika")
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    b = RabbitmqBroker(url=rabbitmq_url)
    try:
        b.connection  # noqa: B018 - opens the connection
    except Exception as e:
        pytest.skip(f"RabbitMQ not reachable: {e}")
    return b


@pytest.fixture(
    params=[
        pytest.param("sqlite"),
        pytest.param("redis", marks=pytest.mark.services),
        pytest.param("rabbitmq", marks=pytest.mark.services),
    ]
)
def any_broker(request: pytest.FixtureRequest) -> Iterator[dramatiq.Broker]:
    url = request.getfixturevalue(f"{request.param}_url")
    factory = {"sqlite": make_sqlite, "redis": make_redis, "rabbitmq": make_rabbitmq}[request.param]
    b = factory(url, request)
    b.add_middleware(MetricsMiddleware(lease_poll_interval_s=0.05))
    yield b
    for queue in list(b.get_declared_queues()):
        try:
            b.flush(queue)
        except Exception:
            pass
    if request.param == "rabbitmq":
        for queue in list(b.get_declared_queues()):
            for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
                try:
                    b.channel.queue_delete(name)
                except Exception:
                    pass
    b.close()


def test_outcomes_durations_waits_and_enqueues(any_broker: dramatiq.Broker) -> None:
    # Given: a queue of its own (counters are process-wide) and four actors
    queue = f"q{uuid.uuid4().hex[:10]}"
    any_broker.add_middleware(SkipActor(f"{queue}_skip"))

    @dramatiq.actor(broker=any_broker, queue_name=queue, actor_name=f"{queue}_ok")
    def ok(i: int) -> None:
        pass

    @dramatiq.actor(broker=any_broker, queue_name=queue, actor_name=f"{queue}_fail", max_retries=1, min_backoff=10)
    def fail() -> None:
        raise ValueError("always")

    @dramatiq.actor(broker=any_broker, queue_name=queue, actor_name=f"{queue}_throws", throws=(KeyError,))
    def throws() -> None:
        raise KeyError("expected")

    @dramatiq.actor(broker=any_broker, queue_name=queue, actor_name=f"{queue}_skip")
    def skip() -> None:
        raise AssertionError("never runs")

    worker = dramatiq.Worker(any_broker, worker_threads=2, worker_timeout=50)
    worker.start()
    try:
        # When
        for i in range(3):
            ok.send(i)
        fail.send()
        throws.send()
        skip.send()

        # Then: every delivery is counted once, with its outcome
        def processed(actor: str, outcome: str) -> float:
            return value("tenure_messages_processed_total", queue=queue, actor=f"{queue}_{actor}", outcome=outcome)

        expected = {
            ("ok", "ok"): 3,
            ("fail", "retried"): 1,
            ("fail", "dead_lettered"): 1,
            ("throws", "dead_lettered"): 1,
            ("skip", "skipped"): 1,
        }
        wait_for(lambda: all(processed(a, o) == n for (a, o), n in expected.items()), f"outcomes {expected}")
        assert processed("ok", "error") == 0 and processed("fail", "ok") == 0

        def enqueued(actor: str) -> float:
            return value("tenure_messages_enqueued_total", queue=queue, actor=f"{queue}_{actor}")

        # the retry is a second enqueue; a delayed message moved from .DQ is not
        assert (enqueued("ok"), enqueued("fail"), enqueued("throws"), enqueued("skip")) == (3, 2, 1, 1)
        assert value("tenure_message_duration_seconds_count", queue=queue, actor=f"{queue}_ok") == 3
        assert value("tenure_message_duration_seconds_count", queue=queue, actor=f"{queue}_fail") == 2
        # first deliveries are observed; the retried one (no due time known) is not
        assert value("tenure_message_queue_wait_seconds_count", queue=queue, actor=f"{queue}_ok") == 3
        assert value("tenure_message_queue_wait_seconds_count", queue=queue, actor=f"{queue}_fail") >= 1
        for actor in ("ok", "fail", "throws", "skip"):
            assert value("tenure_messages_in_progress", queue=queue, actor=f"{queue}_{actor}") == 0
        assert value("tenure_worker_processes") >= 1
    finally:
        worker.stop()
    assert value("tenure_worker_processes") == 0


def test_error_outcome_without_retries_middleware(sqlite_url: str) -> None:
    b = SQLiteBroker(sqlite_url, middleware=[MetricsMiddleware()], lease_ttl_ms=3_000)
    queue = f"q{uuid.uuid4().hex[:10]}"

    @dramatiq.actor(broker=b, queue_name=queue, actor_name=f"{queue}_boom")
    def boom() -> None:
        raise RuntimeError("no Retries here")

    worker = dramatiq.Worker(b, worker_threads=1, worker_timeout=50)
    worker.start()
    try:
        boom.send()
        wait_for(
            lambda: value("tenure_messages_processed_total", queue=queue, actor=f"{queue}_boom", outcome="error") == 1,
            "error outcome",
        )
    finally:
        worker.stop()
        b.close()


def test_sqlite_lease_renewals_and_lost_leases_are_exported(sqlite_url: str) -> None:
    # Given: a 3 s lease (heartbeat every second) and an actor we hold while it runs
    b = SQLiteBroker(sqlite_url, lease_ttl_ms=3_000)
    b.add_middleware(MetricsMiddleware(lease_poll_interval_s=0.05))
    queue = f"q{uuid.uuid4().hex[:10]}"
    started, release = threading.Event(), threading.Event()

    @dramatiq.actor(broker=b, queue_name=queue, actor_name=f"{queue}_held")
    def held() -> None:
        started.set()
        assert release.wait(30)

    renewals0, lost0 = value("tenure_lease_renewals_total"), value("tenure_leases_lost_total")
    worker = dramatiq.Worker(b, worker_threads=1, worker_timeout=50)
    worker.start()
    try:
        held.send()
        assert started.wait(WAIT_S)
        # When: the heartbeat renews the running delivery's lease…
        wait_for(lambda: value("tenure_lease_renewals_total") > renewals0, "a lease renewal")
        assert value("tenure_messages_in_progress", queue=queue, actor=f"{queue}_held") == 1
        # …and then another owner takes the row (as after a stall past the TTL), so the ack is fenced off
        with b.store.write() as conn:
            conn.execute("UPDATE broker_messages SET lease_owner = 'someone-else' WHERE queue = ?", (queue,))
        release.set()
        # Then
        wait_for(lambda: value("tenure_leases_lost_total") == lost0 + 1, "a lost lease")
        assert b.leases_lost == 1
    finally:
        release.set()
        worker.stop()
        b.close()
