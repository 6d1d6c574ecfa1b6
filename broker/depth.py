"""How many messages each queue holds, read from the broker's own counters (SQLite, Redis, RabbitMQ).

One answer for the Queues page, the ``/api/v1/queues`` endpoint and the ``tenure_queue_*`` gauges:
:func:`queue_depths` returns a :class:`QueueDepth` per queue the broker declared. A count the broker
cannot tell is ``None`` (never a guessed 0):

- **SQLite** (:class:`broker.SQLiteBroker`): every state, the lag, pause flags, consumers by their
  lease heartbeats (``stats()``, ``processes()``), for the queues with messages and those declared.
- **Redis** (Dramatiq's ``RedisBroker``): ready = the length of the queue's list; in flight = the
  messages of its ``.msgs`` hash that are not in the list (fetched by a worker and not acked: the
  union of the workers' ``__acks__`` sets, a dead worker's included until maintenance requeues them);
  delayed = the delay queue's ``.DQ.msgs`` hash (waiting, or held by a worker until their eta); dead =
  the ``.XQ`` sorted set; lag = now − the enqueue time (or the eta) of the message at the head of the
  list. All counts of a queue come from one ``MULTI``, so they are consistent with each other.
  Consumers are not tracked per queue by Redis: ``None``.
- **RabbitMQ** (Dramatiq's ``RabbitmqBroker``): a passive ``queue.declare`` of the queue, its
  ``.DQ`` and ``.XQ`` answers the messages *waiting* in each (ready, delayed, dead) and the queue's
  consumers, exactly and at once. AMQP has no other number. With the management API
  (:class:`broker.rabbitmq.TimestampedRabbitmqBroker` built with ``management_url``;
  :mod:`broker.rabbitmq_management`), its per-queue statistics add: in flight = the queue's
  ``messages_unacknowledged``; delayed also counts the ``.DQ`` messages a worker holds until their
  eta (unacknowledged there); lag = now − the head message's ``timestamp`` property (whole seconds),
  which that broker stamps with the message's due time. RabbitMQ samples those statistics every 5 s
  by default, so they trail the declare's counts by up to that long, and a queue not sampled yet has
  none. Without the API (or while it does not answer), in flight and lag are ``None`` and
  ``delayed`` counts only the delayed messages no worker has fetched yet; a head message published
  without a timestamp (e.g. by Dramatiq's own ``RabbitmqBroker``) leaves the lag ``None``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dramatiq.common import current_millis, dq_name, xq_name

#: Broker kinds :func:`broker_kind` tells apart.
SQLITE, POSTGRES, REDIS, RABBITMQ = "sqlite", "postgres", "redis", "rabbitmq"


@dataclass(frozen=True)
class QueueDepth:
    """One queue's messages by state, as its broker counts them (``None``: the broker cannot tell).

    Attributes:
      queue: The queue's name (delay and dead-letter queues are folded into it).
      ready: Messages waiting to be delivered now.
      delayed: Messages whose eta is in the future.
      leased: Messages delivered to a consumer and not acknowledged yet (in flight).
      dead: Dead-lettered messages.
      oldest_ready_age_ms: The lag: how long the oldest ready message has waited (0 when none waits).
      consumers: Consumer processes of the queue.
      paused: Whether an operator paused the queue (only the SQLite broker can).
    """

    queue: str
    ready: int
    delayed: int | None
    leased: int | None
    dead: int | None
    oldest_ready_age_ms: int | None
    consumers: int | None
    paused: bool = False


def broker_kind(broker: Any) -> str | None:
    """``sqlite``, ``postgres``, ``redis``, ``rabbitmq``, or ``None`` for a broker whose counters are unknown here."""
    from .sqlite import SQLiteBroker

    if isinstance(broker, SQLiteBroker):
        return SQLITE
    # By class, not by instance checks, so the optional client libraries are never imported here; a
    # subclass (the default Redis broker, broker.redis_heartbeat) counts as the broker it extends.
    modules = [cls.__module__ for cls in type(broker).__mro__]
    if "broker.postgres" in modules:
        return POSTGRES
    if any(m.startswith("dramatiq.brokers.redis") for m in modules):
        return REDIS
    if any(m.startswith("dramatiq.brokers.rabbitmq") for m in modules):
        return RABBITMQ
    return None


def queue_depths(broker: Any, *, clock: Callable[[], int] = current_millis) -> list[QueueDepth]:
    """Each queue's depth, sorted by name (empty for a broker :func:`broker_kind` does not know).

    The queues are those the broker declared in this process (the SQLite broker adds every queue
    that holds messages or is paused).

    Parameters:
      broker: The broker the process already has.
      clock: Milliseconds since the epoch (tests inject one).

    Raises:
      Whatever the broker's client raises when the server is unreachable (the caller reports it).
    """
    kind = broker_kind(broker)
    if kind == SQLITE:
        return _sqlite_depths(broker, clock())
    if kind == POSTGRES:
        return _postgres_depths(broker, clock())
    if kind == REDIS:
        return _redis_depths(broker, clock())
    if kind == RABBITMQ:
        return _rabbitmq_depths(broker, clock())
    return []


def _canonical_queues(broker: Any) -> list[str]:
    """Declared queues without their ``.DQ``/``.XQ`` companions (Redis declares ``q`` and ``q.DQ``)."""
    return sorted({q for q in broker.get_declared_queues() if not q.endswith((".DQ", ".XQ"))})


def _sqlite_depths(broker: Any, now: int) -> list[QueueDepth]:
    stats = broker.stats()
    # A consumer heartbeats every lease_ttl / 3; one that missed a whole TTL is not counted.
    alive_after = now - broker.lease_ttl_ms
    consumers = {s.queue: 0 for s in stats}
    for p in broker.processes():
        if p["heartbeat_at"] >= alive_after:
            for queue in filter(None, str(p["queues"]).split(",")):
                consumers[queue] = consumers.get(queue, 0) + 1
    depths = {
        s.queue: QueueDepth(
            queue=s.queue,
            ready=s.ready,
            delayed=s.delayed,
            leased=s.leased,
            dead=s.dead,
            oldest_ready_age_ms=s.oldest_ready_age_ms or 0,
            consumers=consumers.get(s.queue, 0),
            paused=bool(s.paused),
        )
        for s in stats
    }
    for q in _canonical_queues(broker):  # declared here, no message yet
        depths.setdefault(q, QueueDepth(q, 0, 0, 0, 0, 0, consumers.get(q, 0)))
    return [depths[q] for q in sorted(depths)]


def _postgres_depths(broker: Any, now: int) -> list[QueueDepth]:
    # No registry of consumer processes (the SQLite broker's broker_processes): consumers are unknown.
    depths = {
        s.queue: QueueDepth(s.queue, s.ready, s.delayed, s.leased, s.dead, s.oldest_ready_age_ms or 0, None)
        for s in broker.stats()
    }
    for q in _canonical_queues(broker):
        depths.setdefault(q, QueueDepth(q, 0, 0, 0, 0, 0, None))
    return [depths[q] for q in sorted(depths)]


def _redis_depths(broker: Any, now: int) -> list[QueueDepth]:
    queues = _canonical_queues(broker)
    if not queues:
        return []
    ns = broker.namespace
    pipe = broker.client.pipeline(transaction=True)
    for q in queues:
        key = f"{ns}:{q}"
        pipe.llen(key)
        pipe.hlen(f"{key}.msgs")
        pipe.hlen(f"{ns}:{dq_name(q)}.msgs")
        pipe.zcard(f"{ns}:{xq_name(q)}")
        pipe.lindex(key, 0)
    replies = pipe.execute()
    heads = [(q, replies[i * 5 + 4]) for i, q in enumerate(queues)]
    head_bodies = _redis_head_bodies(broker, heads)
    depths = []
    for i, q in enumerate(queues):
        ready, held, delayed, dead, _ = replies[i * 5 : i * 5 + 5]
        depths.append(
            QueueDepth(
                queue=q,
                ready=int(ready),
                delayed=int(delayed),
                # The hash holds every message not yet acked: those in the list and those fetched.
                leased=max(0, int(held) - int(ready)),
                dead=int(dead),
                oldest_ready_age_ms=_age_ms(head_bodies.get(q), now) if int(ready) else 0,
                consumers=None,
            )
        )
    return depths


def _redis_head_bodies(broker: Any, heads: list[tuple[str, Any]]) -> dict[str, bytes | None]:
    """The message data of each queue's head message (one pipeline; a head acked meanwhile reads ``None``)."""
    wanted = [(q, mid) for q, mid in heads if mid is not None]
    if not wanted:
        return {}
    pipe = broker.client.pipeline(transaction=False)
    for q, mid in wanted:
        pipe.hget(f"{broker.namespace}:{q}.msgs", mid)
    return {q: body for (q, _), body in zip(wanted, pipe.execute(), strict=True)}


def _age_ms(body: bytes | None, now: int) -> int | None:
    """How long a message has been due: now − max(enqueue time, eta); ``None`` when unreadable."""
    if body is None:
        return None
    try:
        data = json.loads(body)
        due = max(int(data.get("message_timestamp") or 0), int((data.get("options") or {}).get("eta") or 0))
    except (ValueError, TypeError, AttributeError):
        return None
    return max(0, now - due) if due else None


def _rabbitmq_depths(broker: Any, now: int) -> list[QueueDepth]:
    import pika
    from pika.exceptions import ChannelClosedByBroker

    queues = _canonical_queues(broker)
    if not queues:
        return []
    # A connection of its own: a passive declare of a missing queue closes its channel (404), and the
    # broker's per-thread connections belong to its publishers.
    connection = pika.BlockingConnection(broker.parameters)
    try:
        channel = connection.channel()

        def declare(name: str) -> tuple[int, int] | None:
            nonlocal channel
            try:
                ok = channel.queue_declare(name, passive=True).method
            except ChannelClosedByBroker as e:
                if e.reply_code != 404:
                    raise
                channel = connection.channel()
                return None  # not declared on the server yet: nothing waits in it
            return int(ok.message_count), int(ok.consumer_count)

        declared = {q: (declare(q), declare(dq_name(q)), declare(xq_name(q))) for q in queues}
    finally:
        connection.close()
    management = getattr(broker, "management", None)
    sampled = management.queues() if management is not None else None
    depths = []
    for q, (main, delayed, dead) in declared.items():
        ready = main[0] if main else 0
        leased, held, lag = None, 0, None
        if sampled is not None:
            stats, delay_stats = sampled.get(q), sampled.get(dq_name(q))
            # not on the server: nothing in flight; on it but not sampled yet: unknown
            leased = 0 if main is None else stats.in_flight if stats is not None else None
            held = (delay_stats.in_flight or 0) if delay_stats is not None else 0
            head = stats.head_timestamp_s if stats is not None else None
            lag = max(0, now - head * 1000) if head is not None else None
        depths.append(
            QueueDepth(
                queue=q,
                ready=ready,
                delayed=(delayed[0] if delayed else 0) + held,
                leased=leased,
                dead=dead[0] if dead else 0,
                oldest_ready_age_ms=0 if ready == 0 and sampled is not None else lag,
                consumers=main[1] if main else 0,
            )
        )
    return depths
