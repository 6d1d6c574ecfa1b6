"""WakingRedisBroker: Redis consumers that wake within milliseconds of an enqueue instead of polling.

Dramatiq's Redis consumer, finding its queue empty, sleeps an exponential backoff up to the worker's
timeout (a second by default) before it fetches again: an idle worker starts a new job up to a second
late, and a job a minute sees that delay almost every time. Here each enqueue also pushes a wake token
onto ``<ns>:__wake__.<queue>`` (in the same round trip; the list is trimmed, so tokens nobody waits for
cost a few bytes), and an idle consumer blocks on that list (``BLPOP``) for up to its timeout instead of
sleeping. One token wakes one consumer, which fetches; a token that finds the message taken by another
consumer only costs a fetch. A consumer whose prefetch slots are all taken waits for a slot of its own
(an ack) rather than taking tokens it could not use.

Everything else — keys, scripts, acks, delays, the heartbeat and reaper of
:class:`~broker.redis_heartbeat.HeartbeatRedisBroker` — is unchanged.
"""

from __future__ import annotations

import threading
from typing import Any

import redis
from dramatiq.broker import Consumer, MessageProxy
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message

from .redis_heartbeat import HeartbeatRedisBroker

#: Wake tokens kept per queue for consumers that are not waiting yet.
MAX_TOKENS = 1000
#: How long a full consumer (every prefetch slot taken) waits for an ack before looking again, in seconds.
FULL_WAIT_S = 0.05


class WakingRedisBroker(HeartbeatRedisBroker):
    """:class:`HeartbeatRedisBroker` whose idle consumers are woken by enqueues (see the module docstring)."""

    def wake_key(self, queue_name: str) -> str:
        return f"{self.namespace}:__wake__.{queue_name}"

    def enqueue(self, message: Message, *, delay: int | None = None) -> Message:
        enqueued = super().enqueue(message, delay=delay)
        # A delayed message waits in its delay queue, whose consumer enqueues it here again when due.
        if delay is None:
            self.wake(enqueued.queue_name)
        return enqueued

    def wake(self, queue_name: str) -> None:
        """Wake one idle consumer of *queue_name* (or the next one to idle)."""
        key = self.wake_key(queue_name)
        with self.client.pipeline(transaction=False) as pipe:
            pipe.lpush(key, 1).ltrim(key, 0, MAX_TOKENS - 1).execute()

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Consumer:
        """Dramatiq's consumer without its idle sleep (1 ms), waiting on the queue's wake list instead."""
        inner = super().consume(queue_name, prefetch, timeout=1)
        return _WakingConsumer(inner, self, queue_name, timeout / 1000)


class _WakingConsumer(Consumer):
    def __init__(self, inner: Any, broker: WakingRedisBroker, queue_name: str, timeout_s: float) -> None:
        self.inner = inner
        self.broker = broker
        self.key = broker.wake_key(queue_name)
        self.timeout_s = max(0.01, timeout_s)
        self._slot_freed = threading.Event()

    def __next__(self) -> MessageProxy | None:
        message = next(self.inner)
        if message is not None:
            return message  # type: ignore[no-any-return]
        if self.inner.outstanding_message_count >= self.inner.prefetch:
            self._slot_freed.wait(min(FULL_WAIT_S, self.timeout_s))
            self._slot_freed.clear()
            return None
        try:
            self.broker.client.blpop([self.key], timeout=self.timeout_s)
        except redis.ConnectionError as e:
            raise ConnectionClosed(e) from None
        return None

    def _freed(self) -> None:
        self._slot_freed.set()

    def ack(self, message: MessageProxy) -> None:
        self.inner.ack(message)
        self._freed()

    def nack(self, message: MessageProxy) -> None:
        self.inner.nack(message)
        self._freed()

    def requeue(self, messages: Any) -> None:
        self.inner.requeue(messages)
        self._freed()

    def close(self) -> None:
        self.inner.close()

    @property
    def outstanding_message_count(self) -> int:
        return int(self.inner.outstanding_message_count)


__all__ = ["WakingRedisBroker"]
