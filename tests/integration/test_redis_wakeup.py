"""WakingRedisBroker on a real Redis: an idle consumer returns a new message when it is enqueued, not at
its timeout; a consumer with no free slot leaves the wake token to another; delays still wait."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from dramatiq.message import Message

from broker import make_broker
from broker.redis_wakeup import WakingRedisBroker

pytestmark = pytest.mark.services

QUEUE = "wakeup"
#: Far longer than any wake-up: a consumer that answers sooner was woken, not timed out.
IDLE_TIMEOUT_MS = 20_000


@pytest.fixture()
def broker(redis_url: str) -> Iterator[WakingRedisBroker]:
    namespace = f"tenure-wakeup-{uuid.uuid4().hex[:10]}"
    b = make_broker(redis_url, namespace=namespace, middleware=[])
    assert isinstance(b, WakingRedisBroker)
    b.declare_queue(QUEUE)
    yield b
    b.close()
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(f"{namespace}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def message(n: int) -> Message:
    return Message(queue_name=QUEUE, actor_name="noop", args=(n,), kwargs={}, options={})


def _next_message(consumer: Any, until: float) -> Any:
    while time.monotonic() < until:
        found = next(consumer)
        if found is not None:
            return found
    return None


def test_an_idle_consumer_is_woken_by_an_enqueue(broker: WakingRedisBroker) -> None:
    consumer = broker.consume(QUEUE, prefetch=1, timeout=IDLE_TIMEOUT_MS)
    got: list[Any] = []
    waiting = threading.Thread(target=lambda: got.append(_next_message(consumer, time.monotonic() + 15)))
    started = time.monotonic()
    waiting.start()
    # The consumer found nothing and now blocks on the queue's wake list (its BLPOP is the only client
    # waiting on that key).
    probe = redis.Redis(connection_pool=broker.client.connection_pool)
    deadline = time.monotonic() + 10
    while not any(c.get("cmd") == "blpop" for c in probe.client_list()) and time.monotonic() < deadline:
        time.sleep(0.01)
    broker.enqueue(message(1))
    waiting.join(15)
    assert got and got[0] is not None and got[0].args == (1,)
    assert time.monotonic() - started < IDLE_TIMEOUT_MS / 1000 / 2  # woken, not timed out
    consumer.ack(got[0])
    consumer.close()


def test_a_full_consumer_leaves_the_wake_token_to_others(broker: WakingRedisBroker) -> None:
    full = broker.consume(QUEUE, prefetch=1, timeout=IDLE_TIMEOUT_MS)
    broker.enqueue(message(1))
    held = _next_message(full, time.monotonic() + 10)
    assert held is not None
    broker.enqueue(message(2))
    assert next(full) is None  # no free slot: it waits for an ack, not for the token
    assert broker.client.llen(broker.wake_key(QUEUE)) >= 1
    other = broker.consume(QUEUE, prefetch=1, timeout=IDLE_TIMEOUT_MS)
    second = _next_message(other, time.monotonic() + 10)
    assert second is not None and second.args == (2,)
    full.ack(held)
    other.ack(second)
    full.close()
    other.close()


def test_a_delayed_message_pushes_no_token_until_it_is_due(broker: WakingRedisBroker) -> None:
    broker.enqueue(message(1), delay=60_000)
    assert broker.client.llen(broker.wake_key(QUEUE)) == 0
