"""HeartbeatRedisBroker on a real Redis: a dead consumer's unacked messages come back at its heartbeat
timeout (not a millisecond before), a busy live consumer keeps its own, and what it cannot account for
is left to Dramatiq's maintenance."""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import dq_name
from dramatiq.message import Message

from broker import make_broker
from broker.redis_heartbeat import DEFAULT_HEARTBEAT_TIMEOUT_MS, HeartbeatRedisBroker

pytestmark = pytest.mark.services

TIMEOUT_MS = 1_000
QUEUE = "heartbeat"


@pytest.fixture()
def namespace(redis_url: str) -> Iterator[str]:
    ns = f"tenure-heartbeat-{uuid.uuid4().hex[:10]}"
    yield ns
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(f"{ns}:*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture()
def make(redis_url: str, namespace: str) -> Iterator[Callable[..., Any]]:
    brokers: list[Any] = []

    def make(cls: type[RedisBroker] = HeartbeatRedisBroker) -> Any:
        broker = cls(url=redis_url, namespace=namespace, heartbeat_timeout=TIMEOUT_MS, middleware=[])
        broker.declare_queue(QUEUE)
        brokers.append(broker)
        return broker

    yield make
    for broker in brokers:
        broker.close()
        broker.client.close()


def message(n: int) -> Message:
    return Message(queue_name=QUEUE, actor_name="noop", args=(n,), kwargs={}, options={})


def fetch(broker: RedisBroker, queue: str, count: int) -> list[Any]:
    """*count* messages fetched (and left unacked) by a new consumer of *queue*."""
    consumer = broker.consume(queue, prefetch=count, timeout=50)
    got: list[Any] = []
    deadline = time.monotonic() + 10
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} messages arrived"
        m = next(consumer)
        if m is not None:
            got.append(m)
    return got


def heartbeat_of(broker: RedisBroker) -> int | None:
    score = broker.client.zscore(f"{broker.namespace}:__heartbeats__", broker.broker_id)
    return None if score is None else int(score)


def test_a_dead_consumers_messages_come_back_at_its_heartbeat_timeout(make: Callable[..., Any]) -> None:
    # Given: consumer A holds three fetched messages and a delayed one, and stops like a killed process
    a = make()
    for n in range(3):
        a.enqueue(message(n))
    a.enqueue(message(99), delay=60_000)
    held = fetch(a, QUEUE, 3)
    delayed = fetch(a, dq_name(QUEUE), 1)
    a.close()  # its heartbeat stops; nothing was acked or requeued
    last_beat = heartbeat_of(a)
    assert last_beat is not None

    # When: a live consumer beats one millisecond before A's timeout, then at it
    b = make()
    assert b.beat(now_ms=last_beat + TIMEOUT_MS - 1) == (0, 0)
    assert b.beat(now_ms=last_beat + TIMEOUT_MS) == (4, 1)

    # Then: every message A held is delivered again, and A is forgotten
    again = fetch(b, QUEUE, 3)
    assert sorted(m.message_id for m in again) == sorted(m.message_id for m in held)
    assert [m.message_id for m in fetch(b, dq_name(QUEUE), 1)] == [delayed[0].message_id]
    assert heartbeat_of(a) is None
    assert list(b.client.scan_iter(f"{b.namespace}:__*.{a.broker_id}*")) == []


def test_requeued_messages_go_to_the_head_of_a_backlog(make: Callable[..., Any]) -> None:
    # Given: A dies holding one message while two wait behind it
    a = make()
    for n in range(3):
        a.enqueue(message(n))
    [first] = fetch(a, QUEUE, 1)
    a.close()
    last_beat = heartbeat_of(a)
    assert last_beat is not None
    # When: it is reaped
    b = make()
    assert b.beat(now_ms=last_beat + TIMEOUT_MS) == (1, 1)
    # Then: it is the next one delivered, not the last
    assert fetch(b, QUEUE, 1)[0].message_id == first.message_id


def test_a_busy_live_consumer_keeps_its_messages(make: Callable[..., Any]) -> None:
    # Given: A holds two messages and sends no consumer command at all (as with every thread busy)
    a = make()
    for n in range(2):
        a.enqueue(message(n))
    fetch(a, QUEUE, 2)
    first_beat = heartbeat_of(a)
    assert first_beat is not None
    # When: more than a heartbeat timeout passes
    deadline = time.monotonic() + 10
    while (heartbeat_of(a) or 0) <= first_beat + TIMEOUT_MS:
        assert time.monotonic() < deadline, "A's heartbeat thread did not beat"
        time.sleep(0.05)
    # Then: A's own beats kept it alive: a live consumer's beat takes nothing from it
    b = make()
    assert b.beat() == (0, 0)
    assert b.client.scard(f"{b.namespace}:__acks__.{a.broker_id}.{QUEUE}") == 2


def test_consumers_that_never_registered_are_left_to_dramatiqs_maintenance(make: Callable[..., Any]) -> None:
    # Given: a plain Dramatiq consumer (no registration) dies holding a message
    plain = make(RedisBroker)
    plain.enqueue(message(1))
    fetch(plain, QUEUE, 1)
    # When: a heartbeat consumer beats long after
    b = make()
    assert b.beat(now_ms=int(time.time() * 1000) + 3_600_000) == (0, 0)
    # Then: its ack set and heartbeat entry are still there for Dramatiq's maintenance to find
    assert b.client.scard(f"{b.namespace}:__acks__.{plain.broker_id}.{QUEUE}") == 1
    assert heartbeat_of(plain) is not None


def _consume_and_report(broker: HeartbeatRedisBroker, ids: Any) -> None:
    broker.consume(QUEUE, prefetch=1, timeout=50)
    ids.put(broker.broker_id)
    broker.close()


def test_a_forked_process_beats_under_its_own_id(make: Callable[..., Any]) -> None:
    # Given: a broker built before a fork (as by an app imported in a parent that forks its workers)
    parent = make()
    ctx = multiprocessing.get_context("fork")
    ids = ctx.Queue()
    # When: the child consumes
    child = ctx.Process(target=_consume_and_report, args=(parent, ids))
    child.start()
    child_id = ids.get(timeout=30)
    child.join(30)
    # Then: it registered under an id of its own, so a dead child is never kept alive by a sibling
    assert child.exitcode == 0
    assert child_id != parent.broker_id
    assert parent.client.smembers(f"{parent.namespace}:__consumer_queues__.{child_id}") == {QUEUE.encode()}


def test_make_broker_builds_it_for_redis_urls(redis_url: str) -> None:
    default = make_broker(redis_url)
    tuned = make_broker(redis_url, heartbeat_timeout=2_000)
    try:
        assert isinstance(default, HeartbeatRedisBroker)
        assert default.heartbeat_timeout == DEFAULT_HEARTBEAT_TIMEOUT_MS == 5_000
        assert tuned.heartbeat_timeout == 2_000
    finally:
        default.close()
        tuned.close()
    with pytest.raises(ValueError, match="heartbeat_timeout must be at least 500 ms"):
        make_broker(redis_url, heartbeat_timeout=100)
