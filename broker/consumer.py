"""The consumer and message proxy of :class:`broker.SQLiteBroker`."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from dramatiq.broker import Consumer, MessageProxy
from dramatiq.common import current_millis
from dramatiq.message import Message

from .acks import AckHook
from .wakeup import IDLE_REPROBE_S

if TYPE_CHECKING:
    from .sqlite import SQLiteBroker


class PrefetchSlots:
    """Claimed-but-unsettled deliveries of one consumer, capped at its prefetch.

    The proxy keeps a reference to the slots of the consumer that claimed it, so an ack that reaches
    a restarted consumer object still frees the right slot.
    """

    def __init__(self, prefetch: int) -> None:
        self.prefetch = prefetch
        self.outstanding = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        with self._lock:
            self.outstanding += n

    def release(self) -> None:
        with self._lock:
            self.outstanding = max(0, self.outstanding - 1)

    @property
    def free(self) -> int:
        return self.prefetch - self.outstanding


class SQLiteMessageProxy(MessageProxy):
    """A delivered message and the lease it came with: row id, delivery number, prefetch slot."""

    def __init__(
        self, message: Message, row_id: int, deliveries: int, slots: PrefetchSlots, due_at_ms: int | None = None
    ) -> None:
        super().__init__(message)
        self._row_id = row_id
        self._deliveries = deliveries
        self._slots = slots
        self.redelivered = deliveries > 1
        #: When the message became due (its eta, or its enqueue time), in ms: queue wait = start - due_at_ms.
        self.due_at_ms = due_at_ms if due_at_ms is not None else message.message_timestamp
        self._ack_hooks: tuple[AckHook, ...] = ()

    def in_ack_transaction(self, hook: AckHook) -> None:
        """Run ``hook(conn)`` inside the transaction that commits this message's ack or nack.

        For writes that belong with the message's settlement (a job layer's completion record): they
        commit together with it, in the broker's group commit, instead of in a transaction of their
        own. *conn* is the broker's sqlite3 connection; the hook must not commit. If it raises, its
        writes are rolled back and logged and the ack still commits. What it returns, if callable,
        runs after the commit (in the broker's ack thread). The hook runs even when the ack itself is
        fenced (the lease was lost): its own writes carry their own guards.
        """
        self._ack_hooks = (*self._ack_hooks, hook)


class _SQLiteConsumer(Consumer):
    def __init__(self, broker: SQLiteBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        self.broker = broker
        self.queue_name = queue_name
        self.timeout_ms = timeout
        self.slots = PrefetchSlots(max(1, prefetch))
        self._buffer: deque[SQLiteMessageProxy] = deque()
        self._closed = threading.Event()
        # Delay queues exist only because Dramatiq's Worker starts a consumer per ".DQ" queue; delays are
        # native (an eta column on the canonical queue), so these consumers never receive anything.
        self._idle_only = queue_name in broker.delay_queues
        self._just_woke = False

    def __next__(self) -> SQLiteMessageProxy | None:
        if self._idle_only:
            self._closed.wait(self.timeout_ms / 1000)
            return None
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            if self._buffer:
                return self._buffer.popleft()
            if self._closed.is_set():
                return None
            seen = self.broker._waiters.generation(self.queue_name)
            next_eta = None
            if not self.broker._draining and self.slots.free > 0:
                claimed, next_eta = self.broker._claim(self.queue_name, self.slots)
                if claimed:
                    self._buffer.extend(claimed)
                    self._just_woke = True
                    continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            wait = remaining
            if next_eta is not None:
                wait = min(wait, max(0.0, (next_eta - current_millis()) / 1000))
            if self._just_woke:
                self._just_woke = False
                wait = min(wait, IDLE_REPROBE_S)
            if self.broker._waiters.wait(self.queue_name, seen, wait):
                self._just_woke = True
            elif next_eta is None and wait == remaining:
                return None

    def ack(self, message: SQLiteMessageProxy) -> None:  # type: ignore[override]
        self.broker._settle(message, dead=False)

    def nack(self, message: SQLiteMessageProxy) -> None:  # type: ignore[override]
        self.broker._settle(message, dead=True)

    def requeue(self, messages) -> None:  # type: ignore[no-untyped-def]
        self.broker._requeue(list(messages))

    def close(self) -> None:
        self._closed.set()
        buffered, self._buffer = list(self._buffer), deque()
        if buffered:
            self.broker._requeue(buffered, quiet=True)
