"""One broker contract, three brokers: Tenure's SQLiteBroker, the Redis broker ``make_broker`` builds
(Dramatiq's RedisBroker with Tenure's heartbeat) and the RabbitMQ one it builds (Dramatiq's
RabbitmqBroker stamping each message's due time, ``broker.rabbitmq``).

Every test below runs the same assertions against each broker. Where a broker cannot honour a part
of the contract (Redis has no priorities), that part is skipped with the reason, never special-cased
into a weaker assertion.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.broker import Broker, Consumer, MessageProxy
from dramatiq.common import dq_name, xq_name
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message

from broker import SQLiteBroker, make_broker

WAIT_S = 15.0


def wait_until(predicate: Callable[[], Any], timeout_s: float = WAIT_S, what: str = "condition") -> Any:
    """Poll *predicate* until it returns something truthy; fail after *timeout_s*."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.005)


@dataclass
class Backend:
    """A broker under test plus the broker-specific ways to observe it."""

    kind: str
    broker: Broker
    queue: str
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def message(self, actor_name: str = "contract_actor", *args: Any, **options: Any) -> Message:
        return Message(queue_name=self.queue, actor_name=actor_name, args=args, kwargs={}, options=options)

    def dead_letter_ids(self) -> list[str] | None:
        """message_ids of the queue's dead letters, or None where the broker can't list them."""
        if isinstance(self.broker, SQLiteBroker):
            return [d.message_id for d in self.broker.dead_letters_list(self.queue)]
        if self.kind == "redis":
            client = self.broker.client  # type: ignore[attr-defined]
            bodies = client.hvals(f"{self.broker.namespace}:{xq_name(self.queue)}.msgs")  # type: ignore[attr-defined]
            return [Message.decode(b).message_id for b in bodies]
        return None

    def dead_letter_count(self) -> int:
        ids = self.dead_letter_ids()
        if ids is not None:
            return len(ids)
        return self.broker.get_queue_message_counts(self.queue)[2]  # type: ignore[attr-defined]


def _sqlite_backend(tmp_path: Any, queue: str) -> Backend:
    broker = SQLiteBroker(f"sqlite:///{tmp_path}/contract.db", lease_ttl_ms=10_000)
    backend = Backend("sqlite", broker, queue)
    backend.cleanups.append(broker.close)
    return backend


def _redis_backend(url: str, queue: str) -> Backend:
    namespace = f"tenure-contract-{uuid.uuid4().hex[:10]}"
    broker: Any = make_broker(url, namespace=namespace)
    try:
        broker.client.ping()
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"Redis at {url} is not reachable ({e}); run `make services`")
    backend = Backend("redis", broker, queue)

    def drop_keys() -> None:
        broker.close()
        keys = list(broker.client.scan_iter(f"{namespace}:*"))
        if keys:
            broker.client.delete(*keys)
        broker.client.close()

    backend.cleanups.append(drop_keys)
    return backend


def _rabbitmq_backend(url: str, queue: str) -> Backend:
    broker: Any = make_broker(url, max_priority=10)
    backend = Backend("rabbitmq", broker, queue)

    def delete_queues() -> None:
        for name in (queue, dq_name(queue), xq_name(queue)):
            try:
                broker.channel.queue_delete(name)
            except Exception:  # noqa: BLE001 - a channel closed by a 404 is recreated on next access
                del broker.channel
        broker.close()

    backend.cleanups.append(delete_queues)
    return backend


BROKERS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("redis", id="redis", marks=pytest.mark.services),
    pytest.param("rabbitmq", id="rabbitmq", marks=pytest.mark.services),
]


@pytest.fixture(params=BROKERS)
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Backend]:
    queue = f"contract_{uuid.uuid4().hex[:12]}"
    if request.param == "sqlite":
        b = _sqlite_backend(tmp_path, queue)
    elif request.param == "redis":
        b = _redis_backend(request.getfixturevalue("redis_url"), queue)
    else:
        b = _rabbitmq_backend(request.getfixturevalue("rabbitmq_url"), queue)
    b.broker.declare_queue(queue)
    try:
        yield b
    finally:
        for cleanup in reversed(b.cleanups):
            cleanup()


@pytest.fixture()
def worker(backend: Backend) -> Iterator[Worker]:
    w = Worker(backend.broker, worker_timeout=100, worker_threads=4)
    w.start()
    try:
        yield w
    finally:
        w.stop(timeout=10_000)


def consumer_for(backend: Backend, prefetch: int, timeout_ms: int = 100) -> Consumer:
    consumer = backend.broker.consume(backend.queue, prefetch=prefetch, timeout=timeout_ms)
    backend.cleanups.append(lambda: close_quietly(consumer))
    return consumer


def close_quietly(consumer: Consumer) -> None:
    """Close a consumer the test may already have closed (RabbitMQ's raises on a second close)."""
    try:
        consumer.close()
    except ConnectionClosed:
        pass


def next_message(consumer: Consumer, timeout_s: float = WAIT_S) -> MessageProxy:
    """The next delivered message, polling the consumer (whose own timeout is short) until one arrives."""
    return wait_until(lambda: next(consumer), timeout_s, "a delivery")


def pump(backend: Backend, consumer: Consumer) -> None:
    """Let a RabbitMQ consumer send its pending acks/nacks (pika runs them on the consumer's thread)."""
    if backend.kind == "rabbitmq":
        consumer.connection.process_data_events(time_limit=0)  # type: ignore[attr-defined]


def drain_for(consumer: Consumer, calls: int) -> list[MessageProxy]:
    """Call ``next()`` *calls* times without acking; return what was handed out."""
    return [m for m in (next(consumer) for _ in range(calls)) if m is not None]


# -- tests ---------------------------------------------------------------------------------------------


def test_round_trip_with_a_worker(backend: Backend, worker: Worker) -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def record(n: int) -> None:
        with lock:
            seen.append(n)

    actor = dramatiq.actor(record, broker=backend.broker, queue_name=backend.queue, actor_name="record")

    for n in range(20):
        actor.send(n)

    wait_until(lambda: len(seen) >= 20, what="20 runs")
    backend.broker.join(backend.queue, timeout=10_000)
    assert sorted(seen) == list(range(20))
    assert backend.dead_letter_count() == 0


def test_delayed_message_runs_after_its_delay_and_is_returned_on_the_delay_queue(
    backend: Backend, worker: Worker
) -> None:
    ran_at: list[float] = []
    actor = dramatiq.actor(
        lambda: ran_at.append(time.time()), broker=backend.broker, queue_name=backend.queue, actor_name="delayed"
    )
    delay_ms = 400

    sent_at = time.time()
    returned = actor.send_with_options(delay=delay_ms)

    assert returned.queue_name == dq_name(backend.queue)
    assert isinstance(returned.options["eta"], int)
    assert returned.options["eta"] >= int(sent_at * 1000) + delay_ms
    wait_until(lambda: ran_at, what="the delayed run")
    assert ran_at[0] - sent_at >= delay_ms / 1000
    assert len(ran_at) == 1


def test_retries_reuse_the_message_id_and_nothing_is_lost_or_overwritten(backend: Backend, worker: Worker) -> None:
    # Given an actor that fails twice, then succeeds (Retries re-enqueues the SAME message_id while
    # the failed delivery is still unacked)
    runs: list[str] = []
    succeeded: list[str] = []

    def flaky() -> None:
        message_id = dramatiq.middleware.CurrentMessage.get_current_message().message_id  # type: ignore[union-attr]
        runs.append(message_id)
        if len(runs) <= 2:
            raise RuntimeError(f"planned failure {len(runs)}")
        succeeded.append(message_id)

    backend.broker.add_middleware(dramatiq.middleware.CurrentMessage())
    actor = dramatiq.actor(
        flaky, broker=backend.broker, queue_name=backend.queue, actor_name="flaky", min_backoff=10, max_backoff=50
    )

    # When it is sent once
    sent = actor.send()

    # Then it runs exactly three times with one message_id, and the last run succeeds
    wait_until(lambda: succeeded, what="the successful third run")
    backend.broker.join(backend.queue, timeout=10_000)
    assert runs == [sent.message_id] * 3
    assert succeeded == [sent.message_id]
    assert backend.dead_letter_count() == 0


def test_same_message_enqueued_again_while_in_flight_is_delivered_twice(backend: Backend) -> None:
    message = backend.message("dup")
    backend.broker.enqueue(message)
    consumer = consumer_for(backend, prefetch=2)
    first = next_message(consumer)

    backend.broker.enqueue(message)  # same message_id, the first delivery still unacked
    consumer.ack(first)
    second = next_message(consumer)
    consumer.ack(second)

    assert first.message_id == second.message_id == message.message_id
    assert drain_for(consumer, 3) == []


def test_nack_dead_letters_the_message(backend: Backend) -> None:
    message = backend.message("doomed")
    backend.broker.enqueue(message)
    consumer = consumer_for(backend, prefetch=1)

    consumer.nack(next_message(consumer))

    def dead_lettered() -> bool:
        pump(backend, consumer)
        return backend.dead_letter_count() == 1

    wait_until(dead_lettered, what="one dead letter")
    ids = backend.dead_letter_ids()
    if ids is not None:  # RabbitMQ only exposes the XQ's count
        assert ids == [message.message_id]
    assert drain_for(consumer, 3) == []


def test_consumer_never_hands_out_more_than_prefetch_unacked_messages(backend: Backend) -> None:
    for n in range(10):
        backend.broker.enqueue(backend.message("bulk", n))
    consumer = consumer_for(backend, prefetch=3)

    held = [next_message(consumer)]
    held += drain_for(consumer, 10)
    assert len(held) == 3

    consumer.ack(held.pop(0))
    held.append(next_message(consumer))
    held += drain_for(consumer, 5)
    assert len(held) == 3

    for m in held:
        consumer.ack(m)


def test_flush_drops_ready_and_delayed_messages(backend: Backend) -> None:
    for n in range(3):
        backend.broker.enqueue(backend.message("flushed", n))
    backend.broker.enqueue(backend.message("flushed", 99), delay=100)
    if backend.kind == "rabbitmq":  # publishes are asynchronous to the queue's counters
        wait_until(lambda: backend.broker.get_queue_message_counts(backend.queue)[:2] == (3, 1), what="4 queued")

    backend.broker.flush(backend.queue)

    consumer = consumer_for(backend, prefetch=5, timeout_ms=300)  # longer than the delay
    delay_consumer = consumer_for_queue(backend, dq_name(backend.queue), prefetch=5, timeout_ms=300)
    assert drain_for(consumer, 3) == []
    assert drain_for(delay_consumer, 2) == []


def consumer_for_queue(backend: Backend, queue: str, prefetch: int, timeout_ms: int) -> Consumer:
    consumer = backend.broker.consume(queue, prefetch=prefetch, timeout=timeout_ms)
    backend.cleanups.append(lambda: close_quietly(consumer))
    return consumer


def test_flush_all_drops_every_declared_queue(backend: Backend) -> None:
    other = f"{backend.queue}_other"
    backend.broker.declare_queue(other)
    if backend.kind == "rabbitmq":
        backend.cleanups.append(lambda: [backend.broker.channel.queue_delete(n) for n in (other, dq_name(other))])
    for queue in (backend.queue, other):
        for n in range(2):
            backend.broker.enqueue(Message(queue_name=queue, actor_name="a", args=(n,), kwargs={}, options={}))
    if backend.kind == "rabbitmq":
        wait_until(lambda: backend.broker.get_queue_message_counts(other)[0] == 2, what="2 queued")

    backend.broker.flush_all()

    assert drain_for(consumer_for(backend, prefetch=5), 2) == []
    assert drain_for(consumer_for_queue(backend, other, prefetch=5, timeout_ms=100), 2) == []


def test_higher_broker_priority_is_delivered_first(backend: Backend) -> None:
    if backend.kind == "redis":
        pytest.skip("RedisBroker ignores broker_priority: its queues are FIFO lists")
    for priority in (1, 4, 0, 3, 2):
        backend.broker.enqueue(backend.message("prio", priority, broker_priority=priority))
    if backend.kind == "rabbitmq":
        wait_until(lambda: backend.broker.get_queue_message_counts(backend.queue)[0] == 5, what="5 queued")
    consumer = consumer_for(backend, prefetch=1)

    order = []
    for _ in range(5):
        m = next_message(consumer)
        order.append(m.args[0])
        consumer.ack(m)

    assert order == [4, 3, 2, 1, 0]


def test_requeued_unacked_messages_are_consumable_again(backend: Backend) -> None:
    sent = [backend.message("requeued", n) for n in range(3)]
    for m in sent:
        backend.broker.enqueue(m)
    first = consumer_for(backend, prefetch=3)
    held = [next_message(first) for _ in range(3)]

    first.requeue(held)
    first.close()

    second = consumer_for(backend, prefetch=3)
    again = [next_message(second) for _ in range(3)]
    assert sorted(m.message_id for m in again) == sorted(m.message_id for m in sent)
    for m in again:
        second.ack(m)
    assert drain_for(second, 2) == []


def test_closing_a_consumer_gives_back_its_prefetched_messages(backend: Backend) -> None:
    if backend.kind == "redis":
        pytest.skip(
            "RedisBroker's consumer keeps prefetched messages in a local cache on close; they come back "
            "only once the broker stops heartbeating (its process exits: test_redis_heartbeat.py)"
        )
    sent = [backend.message("prefetched", n) for n in range(3)]
    for m in sent:
        backend.broker.enqueue(m)
    first = consumer_for(backend, prefetch=3)
    handed_out = next_message(first)
    wait_until(lambda: _prefetched(backend, first) >= 2, what="the rest to be prefetched")

    first.requeue([handed_out])
    first.close()

    second = consumer_for(backend, prefetch=3)
    again = [next_message(second) for _ in range(3)]
    assert sorted(m.message_id for m in again) == sorted(m.message_id for m in sent)


def _prefetched(backend: Backend, consumer: Consumer) -> int:
    """Messages the consumer holds but has not handed out (best effort per broker)."""
    if backend.kind == "sqlite":
        return len(consumer._buffer)  # type: ignore[attr-defined]
    if backend.kind == "rabbitmq":
        consumer.connection.process_data_events(time_limit=0)  # type: ignore[attr-defined]
        return 2 if backend.broker.get_queue_message_counts(backend.queue)[0] == 0 else 0
    return 0
