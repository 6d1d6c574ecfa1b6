"""What the SQLite and PostgreSQL lease brokers share: their queues, the stored shape of a message, joining a
queue, the dead letter's body, and regenerating process state in a forked child.

Both keep a message as a row with an ``eta`` on its canonical queue (delays are native), so each queue's
``.DQ`` companion is declared only because Dramatiq's Worker starts a consumer per delay queue.
"""

from __future__ import annotations

import dataclasses
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dramatiq.broker import Broker
from dramatiq.common import current_millis, dq_name, q_name
from dramatiq.errors import QueueJoinTimeout, QueueNotFound
from dramatiq.message import Message

from .hooks import HookDispatch

#: How often ``join`` re-checks the database, in seconds.
JOIN_POLL_S = 0.005
#: How long a delivery stays leased without a heartbeat, in milliseconds.
DEFAULT_LEASE_TTL_MS = 30_000
#: Shortest lease TTL accepted, in milliseconds (heartbeats run at a third of it).
MIN_LEASE_TTL_MS = 1_000
#: Redeliveries after which a message is dead-lettered as poison.
DEFAULT_MAX_DELIVERIES = 10
#: How long dead letters are kept, in milliseconds (7 days, as Dramatiq's other brokers).
DEFAULT_DEAD_MESSAGE_TTL_MS = 7 * 24 * 3600 * 1000
#: Upper bound of rows leased by one claim.
MAX_CLAIM_BATCH = 256
#: How often expired leases are reclaimed, in seconds.
DEFAULT_REAP_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Enqueued:
    """A message as a lease broker stores it, and as ``enqueue`` returns it.

    Attributes:
      queue: The canonical queue (never ``.DQ``).
      returned: What Dramatiq's other brokers return: with a delay, a copy on the ``.DQ`` queue with
        ``options["eta"]``.
      stored: The message of the row (canonical queue, no ``eta`` option).
      eta: When it may run, ms epoch.
      priority: The row's sort key (lower first): minus the ``broker_priority`` option.
      now: The enqueue time, ms epoch.
    """

    queue: str
    returned: Message
    stored: Message
    eta: int
    priority: int
    now: int

    def row(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "message_id": self.stored.message_id,
            "actor": self.stored.actor_name,
            "priority": self.priority,
            "eta": self.eta,
            "enqueued_at": self.now,
            "body": self.stored.encode(),
        }


def check_lease_options(lease_ttl_ms: int, max_deliveries: int) -> None:
    """Refuse a lease TTL under :data:`MIN_LEASE_TTL_MS` or fewer than one delivery.

    Raises:
      ValueError: With what was given.
    """
    if lease_ttl_ms < MIN_LEASE_TTL_MS:
        raise ValueError(f"lease_ttl_ms must be at least {MIN_LEASE_TTL_MS} ms, got {lease_ttl_ms}")
    if max_deliveries < 1:
        raise ValueError("max_deliveries must be at least 1")


class LeaseBroker(HookDispatch, Broker):
    """The Dramatiq API the lease brokers answer alike; subclasses store the rows."""

    def declare_queue(self, queue_name: str) -> None:
        if queue_name in self.queues:
            return
        self.emit_before("declare_queue", queue_name)
        self.queues.add(queue_name)  # type: ignore[attr-defined]
        self.emit_after("declare_queue", queue_name)
        delayed = dq_name(queue_name)
        self.delay_queues.add(delayed)
        self.emit_after("declare_delay_queue", delayed)

    def get_declared_queues(self) -> set[str]:
        return set(self.queues)

    def get_declared_delay_queues(self) -> set[str]:
        return self.delay_queues.copy()

    def flush_all(self) -> None:
        for queue_name in self.queues:
            self.flush(queue_name)

    def _enqueued(self, message: Message, delay: int | None) -> Enqueued:
        """*message* as its row stores it.

        Raises:
          QueueNotFound: The queue was never declared.
        """
        canonical = q_name(message.queue_name)
        if canonical not in self.queues:
            raise QueueNotFound(message.queue_name)
        now = current_millis()
        options = dict(message.options)
        eta = options.pop("eta", None)
        if delay is not None:
            eta = now + int(delay)
            returned = message.copy(queue_name=dq_name(canonical), options={"eta": eta})
        else:
            returned = message
        if not isinstance(eta, int | float):
            eta = now
        if canonical == message.queue_name and "eta" not in message.options:
            stored = message  # already in stored shape: no second Message to build and encode
        else:
            stored = Message(
                queue_name=canonical,
                actor_name=message.actor_name,
                args=message.args,
                kwargs=message.kwargs,
                options=options,
                message_id=message.message_id,
                message_timestamp=message.message_timestamp,
            )
        priority = -int(options.get("broker_priority", 0) or 0)
        return Enqueued(canonical, returned, stored, int(eta), priority, now)

    def _join(
        self, queue_name: str, timeout: int | None, *, flush: Callable[[], Any], pending: Callable[[str], int]
    ) -> None:
        """Wait until ``pending(queue)`` is 0, committing this process's acks (``flush()``) before each look.

        Raises:
          QueueJoinTimeout: When *timeout* (ms) elapses first.
          QueueNotFound: When the queue was never declared.
        """
        canonical = q_name(queue_name)
        if canonical not in self.queues:
            raise QueueNotFound(queue_name)
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        while True:
            flush()
            if pending(canonical) == 0:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise QueueJoinTimeout(queue_name)
            time.sleep(JOIN_POLL_S)


def dead_letter(message: Message, exception: BaseException | None) -> tuple[bytes, str]:
    """What a nacked message's dead letter keeps: the message as it last ran, without a delay's ``eta``, and
    the reason (the actor's last *exception*, if any)."""
    reason = f"nack: {type(exception).__name__}: {exception}"[:500] if exception else "nack"
    if "eta" in message.options:
        options = {k: v for k, v in message.options.items() if k != "eta"}
        message = dataclasses.replace(message, options=options)
    return message.encode(), reason


class AfterForkRegistry:
    """Brokers whose process state a forked child regenerates (their ``_after_fork_in_child``)."""

    def __init__(self) -> None:
        self._brokers: weakref.WeakSet[Any] = weakref.WeakSet()
        os.register_at_fork(after_in_child=self._after_fork)

    def add(self, broker: Any) -> None:
        self._brokers.add(broker)

    def _after_fork(self) -> None:
        for broker in list(self._brokers):
            broker._after_fork_in_child()


after_fork = AfterForkRegistry()
