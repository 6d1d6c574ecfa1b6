"""``broker.depth``: each broker's own counters, on a real SQLite file, Redis and RabbitMQ."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator

import dramatiq
import pytest
from dramatiq.common import current_millis, dq_name

from broker import SQLiteBroker
from broker.depth import QueueDepth, broker_kind, queue_depths


def msg(queue: str) -> dramatiq.Message:
    return dramatiq.Message(queue_name=queue, actor_name="work", args=(), kwargs={}, options={})


def depth_of(broker: dramatiq.Broker, queue: str, **kwargs: object) -> QueueDepth:
    return next(d for d in queue_depths(broker, **kwargs) if d.queue == queue)  # type: ignore[arg-type]


def wait_depth(broker: dramatiq.Broker, queue: str, check, what: str, **kwargs: object) -> QueueDepth:  # type: ignore[no-untyped-def]
    # RabbitMQ's management API samples its statistics every 5 s: up to two samples late
    deadline = time.monotonic() + 15
    while True:
        d = depth_of(broker, queue, **kwargs)
        if check(d):
            return d
        assert time.monotonic() < deadline, f"{what}: last {d}"
        time.sleep(0.05)


def take(consumer: dramatiq.Consumer, n: int) -> list[dramatiq.MessageProxy]:
    """The next *n* deliveries (a ``None`` from an idle poll also lets the consumer send its acks/nacks)."""
    got: list[dramatiq.MessageProxy] = []
    deadline = time.monotonic() + 10
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {len(got)} of {n} deliveries arrived"
        proxy = next(consumer)
        if proxy is not None:
            got.append(proxy)
    return got


def fill(broker: dramatiq.Broker, queue: str) -> tuple[dramatiq.Consumer, list[dramatiq.MessageProxy]]:
    """7 due and 2 delayed messages; a consumer (prefetch 3) got 4, nacked the first: 3 in flight, 1 dead.

    The caller keeps the consumer: closing it would give its deliveries back.
    """
    broker.declare_queue(queue)
    for _ in range(7):
        broker.enqueue(msg(queue))
    for _ in range(2):
        broker.enqueue(msg(queue), delay=600_000)
    consumer = broker.consume(queue, prefetch=3, timeout=100)
    held = take(consumer, 3)
    consumer.nack(held[0])
    held = held[1:] + take(consumer, 1)  # the freed prefetch slot fills again
    return consumer, held


def test_sqlite_counts_every_state_the_lag_and_consumers(sqlite_url: str) -> None:
    broker = SQLiteBroker(sqlite_url, middleware=[], lease_ttl_ms=3_000)
    try:
        queue = "q"
        consumer, _ = fill(broker, queue)
        broker.declare_queue("empty")
        wait_depth(broker, queue, lambda d: d.dead == 1 and d.consumers == 1, "the nack and the heartbeat written")
        time.sleep(0.3)
        d = depth_of(broker, queue)
        assert (d.ready, d.delayed, d.leased, d.dead, d.consumers, d.paused) == (3, 2, 3, 1, 1, False)
        assert 300 <= d.oldest_ready_age_ms < 30_000  # the broker's own clock
        assert depth_of(broker, "empty").oldest_ready_age_ms == 0  # nothing waits: no lag
        assert broker_kind(broker) == "sqlite"
        consumer.close()
    finally:
        broker.close()


@pytest.fixture(params=["dramatiq", "make_broker"])
def redis_broker(redis_url: str, request: pytest.FixtureRequest) -> Iterator[dramatiq.Broker]:
    """Dramatiq's RedisBroker, and the one ``make_broker`` builds by default (a subclass of it)."""
    from dramatiq.brokers.redis import RedisBroker

    from broker import make_broker

    namespace = f"tenure-depth-{uuid.uuid4().hex[:8]}"
    if request.param == "dramatiq":
        broker = RedisBroker(url=redis_url, namespace=namespace, middleware=[])
    else:
        broker = make_broker(redis_url, namespace=namespace, middleware=[])
    yield broker
    keys = list(broker.client.scan_iter(f"{broker.namespace}:*"))
    if keys:
        broker.client.delete(*keys)
    broker.close()


@pytest.mark.services
def test_redis_counts_ready_in_flight_delayed_dead_and_the_lag(redis_broker: dramatiq.Broker) -> None:
    queue = "q"
    consumer, held = fill(redis_broker, queue)
    d = depth_of(redis_broker, queue, clock=lambda: current_millis() + 5_000)
    # ready: the list; in flight: fetched, not acked; delayed: the .DQ hash; dead: the .XQ set
    assert (d.ready, d.delayed, d.leased, d.dead) == (3, 2, 3, 1)
    assert 5_000 <= d.oldest_ready_age_ms < 30_000
    assert d.consumers is None  # Redis does not track consumers per queue
    assert d.paused is False
    assert broker_kind(redis_broker) == "redis"
    # an ack ends the flight; a drained queue has no lag
    for proxy in held:
        consumer.ack(proxy)
    for proxy in take(consumer, 3):
        consumer.ack(proxy)
    d = depth_of(redis_broker, queue)
    assert (d.ready, d.leased, d.oldest_ready_age_ms) == (0, 0, 0)


@pytest.fixture()
def rabbitmq_broker(rabbitmq_url: str) -> Iterator[dramatiq.Broker]:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker = RabbitmqBroker(url=rabbitmq_url, middleware=[])
    yield broker
    for queue in list(broker.get_declared_queues()):
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            broker.channel.queue_delete(name)
    broker.close()


@pytest.mark.services
def test_rabbitmq_counts_what_waits_and_the_consumers_but_not_the_flight(rabbitmq_broker: dramatiq.Broker) -> None:
    queue = f"tenure_depth_{uuid.uuid4().hex[:8]}"
    # Given: declared in this process but not on the server yet: nothing waits
    rabbitmq_broker.declare_queue(queue)
    assert depth_of(rabbitmq_broker, queue) == QueueDepth(queue, 0, 0, None, 0, None, 0)
    # When: 7 due + 2 delayed, 3 delivered to a consumer, 1 of them nacked
    consumer, _ = fill(rabbitmq_broker, queue)
    # Then: RabbitMQ counts what waits (unacknowledged deliveries are not in its counts)
    d = wait_depth(rabbitmq_broker, queue, lambda d: d.dead == 1, "the nacked message dead-lettered")
    assert (d.ready, d.delayed, d.dead, d.consumers) == (3, 2, 1, 1)
    assert d.leased is None and d.oldest_ready_age_ms is None  # AMQP has no such counters
    assert broker_kind(rabbitmq_broker) == "rabbitmq"
    consumer.close()


@pytest.fixture()
def managed_rabbitmq_broker(rabbitmq_url: str, rabbitmq_management_url: str) -> Iterator[dramatiq.Broker]:
    """The RabbitMQ broker ``make_broker`` builds, with the management API (the AMQP URL's credentials)."""
    from broker import make_broker

    broker = make_broker(rabbitmq_url, middleware=[], rabbitmq_management_url=rabbitmq_management_url)
    yield broker
    for queue in list(broker.get_declared_queues()):
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            broker.channel.queue_delete(name)
    broker.close()


@pytest.mark.services
def test_rabbitmq_with_its_management_api_counts_the_flight_the_held_delays_and_the_lag(
    managed_rabbitmq_broker: dramatiq.Broker,
) -> None:
    broker = managed_rabbitmq_broker
    queue = f"tenure_depth_{uuid.uuid4().hex[:8]}"
    broker.declare_queue(queue)
    enqueued_at = current_millis()
    # Given: 7 due + 2 delayed, 3 in flight to a consumer (1 nacked: dead), and the 2 delayed ones
    # fetched by a worker that holds them until their eta
    consumer, held = fill(broker, queue)
    delays = broker.consume(dq_name(queue), prefetch=10, timeout=100)
    take(delays, 2)
    # Then: in flight from the management API's statistics, the held delays counted as delayed, and
    # the lag from the head message's timestamp (stamped by the broker: whole seconds)
    later = lambda: current_millis() + 5_000  # noqa: E731 - a clock 5 s ahead
    sampled = lambda d: d.leased == 3 and d.delayed == 2 and d.oldest_ready_age_ms is not None  # noqa: E731
    d = wait_depth(broker, queue, sampled, "sampled", clock=later)
    assert (d.ready, d.delayed, d.leased, d.dead, d.consumers) == (3, 2, 3, 1, 1)
    assert 5_000 <= d.oldest_ready_age_ms <= current_millis() + 5_000 - (enqueued_at // 1000) * 1000
    # When: every message is acked
    delays.close()
    for proxy in held:
        consumer.ack(proxy)
    for proxy in take(consumer, 3):
        consumer.ack(proxy)
    assert next(consumer) is None  # nothing more to deliver; the consumer sends its acks meanwhile
    # Then: nothing waits (no lag, at once: the declare says so), nothing is in flight once sampled
    d = wait_depth(broker, queue, lambda d: d.leased == 0, "the acks sampled")
    assert (d.ready, d.leased, d.oldest_ready_age_ms) == (0, 0, 0)
    consumer.close()


@pytest.mark.services
def test_rabbitmq_messages_carry_the_time_they_are_due(managed_rabbitmq_broker: dramatiq.Broker) -> None:
    import pika

    broker = managed_rabbitmq_broker
    queue = f"tenure_stamp_{uuid.uuid4().hex[:8]}"
    broker.declare_queue(queue)
    now = msg(queue)
    broker.enqueue(now)
    # a delayed message moved to its queue when due (what a worker does) carries its eta
    eta = current_millis() + 3_600_000
    broker.enqueue(now.copy(message_id="moved", options={"eta": eta}))
    channel = pika.BlockingConnection(broker.parameters).channel()
    try:
        stamps = []
        for _ in range(2):
            _, properties, _ = channel.basic_get(queue, auto_ack=True)
            stamps.append(properties.timestamp)
    finally:
        channel.connection.close()
    assert stamps == [now.message_timestamp // 1000, eta // 1000]


@pytest.mark.services
def test_rabbitmq_without_an_answering_management_api_tells_what_waits_and_logs_once(
    rabbitmq_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from broker import make_broker

    queue = f"tenure_depth_{uuid.uuid4().hex[:8]}"
    wrong = make_broker(
        rabbitmq_url, middleware=[], rabbitmq_management_url="http://guest:not-the-password@127.0.0.1:15672"
    )
    closed = make_broker(rabbitmq_url, middleware=[], rabbitmq_management_url="http://127.0.0.1:9/")
    try:
        wrong.declare_queue(queue)
        closed.declare_queue(queue)
        wrong.enqueue(msg(queue))
        wait_depth(wrong, queue, lambda d: d.ready == 1, "the message counted")
        with caplog.at_level(logging.WARNING, logger="broker.rabbitmq_management"):
            for broker in (wrong, wrong, closed, closed):
                d = depth_of(broker, queue)
                # what the declare tells, and the rest unknown
                assert (d.ready, d.delayed, d.leased, d.dead, d.oldest_ready_age_ms) == (1, 0, None, 0, None)
        # Only the management client's own lines (a keeper thread another test left may log too).
        warnings = [r.getMessage() for r in caplog.records if r.name == "broker.rabbitmq_management"]
        assert warnings == [
            "RabbitMQ's management API at http://127.0.0.1:15672 did not answer (HTTP 401): no in-flight counts "
            "or lag until it does.",
            "RabbitMQ's management API at http://127.0.0.1:9 did not answer (ConnectError): no in-flight counts "
            "or lag until it does.",
        ]
        assert "not-the-password" not in caplog.text
    finally:
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            wrong.channel.queue_delete(name)
        wrong.close()
        closed.close()


def test_an_unknown_broker_has_no_counters() -> None:
    from dramatiq.brokers.stub import StubBroker

    stub = StubBroker()
    stub.declare_queue("q")
    assert broker_kind(stub) is None
    assert queue_depths(stub) == []
