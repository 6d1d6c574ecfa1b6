"""HeartbeatRedisBroker: Dramatiq's RedisBroker whose dead consumers' messages come back within seconds.

Dramatiq's RedisBroker moves each fetched message id into ``<ns>:__acks__.<broker id>.<queue>`` until
it is acked, and counts every command a broker sends as its heartbeat (``<ns>:__heartbeats__``, a
sorted set of broker ids by time). Messages of a broker whose heartbeat is older than
``heartbeat_timeout`` go back to their queue during *maintenance*, which a command triggers with a
chance of ``maintenance_chance`` per million (default 0.1 %), for that command's queue only, after a
default timeout of 60 s. A SIGKILLed worker's prefetched messages thus wait a minute or more, at
random, while their jobs show ``queued``.

This subclass keeps Dramatiq's keys, commands and maintenance, and adds, in each process that consumes:

- **a heartbeat thread** (every ``heartbeat_timeout / 5``): one Lua call records the heartbeat and the
  queues this broker consumes (``<ns>:__consumer_queues__.<broker id>``, refreshed by every beat and
  written before the first fetch of a queue). A process whose worker threads are all busy, whose
  consumers therefore send nothing, still beats; only a dead or frozen process stops.
- **a reaper in the same call**: every broker silent for ``heartbeat_timeout`` that registered its
  queues gets each unacked message of each of those queues pushed back to the *head* of its queue
  (it was fetched from there; it must not wait behind a backlog), then its ack sets, registration and
  heartbeat entry are deleted. Every live consumer reaps every beat, for all queues (not just its
  own), so a dead consumer's messages are back within ``heartbeat_timeout`` plus one beat.

A broker taken for dead while alive (frozen past the timeout) has its messages delivered twice; its
next beat registers it again. Job messages tolerate that (the job's claim is guarded). Brokers that
never registered (producers, plain Dramatiq consumers) are left to Dramatiq's maintenance, which can
still find their ack sets. Heartbeats are client clocks, as in Dramatiq: hosts must agree on the time
to well within the timeout (NTP). The keys the script touches are computed inside it, so it needs a
single Redis node (not Redis Cluster), like Dramatiq's own dispatch script.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from typing import Any

import redis
from dramatiq.broker import Consumer
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis
from dramatiq.errors import ConnectionClosed

from .hooks import HookDispatch

logger = logging.getLogger(__name__)

#: How long a consumer may be silent before its unacked messages go back to their queues, in milliseconds.
DEFAULT_HEARTBEAT_TIMEOUT_MS = 5_000
#: Shortest heartbeat timeout accepted, in milliseconds.
MIN_HEARTBEAT_TIMEOUT_MS = 500
#: Beats per heartbeat timeout: a live consumer may miss four in a row and still not be taken for dead.
BEATS_PER_TIMEOUT = 5
#: A consumer's queue registration outlives its last beat by this long, in milliseconds, so a dead
#: consumer is reaped after an outage of every consumer (if Dramatiq's maintenance dropped its
#: heartbeat entry first, the registration just expires).
REGISTRATION_TTL_MS = 24 * 3600 * 1000

#: beat(keys=[namespace], args=[now, broker id, heartbeat timeout, registration TTL, queue...])
#: -> {messages requeued, dead consumers reaped}
BEAT_SCRIPT = """
local namespace = KEYS[1]
local now = tonumber(ARGV[1])
local me = ARGV[2]
local heartbeat_timeout = tonumber(ARGV[3])
local registration_ttl = tonumber(ARGV[4])
local heartbeats = namespace .. ":__heartbeats__"
local registrations = namespace .. ":__consumer_queues__."

redis.call("zadd", heartbeats, now, me)
if #ARGV > 4 then
    redis.call("sadd", registrations .. me, unpack(ARGV, 5))
    redis.call("pexpire", registrations .. me, registration_ttl)
end

local requeued, reaped = 0, 0
for _, dead in ipairs(redis.call("zrangebyscore", heartbeats, "-inf", now - heartbeat_timeout)) do
    local queues = redis.call("smembers", registrations .. dead)
    if #queues > 0 then
        for _, queue_name in ipairs(queues) do
            local acks = namespace .. ":__acks__." .. dead .. "." .. queue_name
            local queue_full_name = namespace .. ":" .. queue_name
            local queue_messages = queue_full_name .. ".msgs"
            for _, message_id in ipairs(redis.call("smembers", acks)) do
                if redis.call("hexists", queue_messages, message_id) == 1 then
                    redis.call("lpush", queue_full_name, message_id)
                    requeued = requeued + 1
                end
            end
            redis.call("del", acks)
        end
        redis.call("del", registrations .. dead)
        redis.call("zrem", heartbeats, dead)
        reaped = reaped + 1
    end
end
return {requeued, reaped}
"""


class HeartbeatRedisBroker(HookDispatch, RedisBroker):
    """Dramatiq's :class:`~dramatiq.brokers.redis.RedisBroker` with a heartbeat thread and a reaper.

    Parameters:
      heartbeat_timeout: Milliseconds of silence after which a consumer's unacked messages go back to
        their queues (Dramatiq's parameter; default :data:`DEFAULT_HEARTBEAT_TIMEOUT_MS` instead of 60 s).
      **options: Dramatiq's RedisBroker parameters (``url``, ``namespace``, ``middleware``, …).

    Raises:
      ValueError: A heartbeat timeout under :data:`MIN_HEARTBEAT_TIMEOUT_MS`.
    """

    def __init__(self, *, heartbeat_timeout: int = DEFAULT_HEARTBEAT_TIMEOUT_MS, **options: Any) -> None:
        if heartbeat_timeout < MIN_HEARTBEAT_TIMEOUT_MS:
            raise ValueError(
                f"heartbeat_timeout must be at least {MIN_HEARTBEAT_TIMEOUT_MS} ms, got {heartbeat_timeout}"
            )
        super().__init__(heartbeat_timeout=heartbeat_timeout, **options)
        self._beat_script = self.client.register_script(BEAT_SCRIPT)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._consumed: set[str] = set()
        self._heart: _Heart | None = None

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Consumer:
        """Dramatiq's consumer, after registering *queue_name* for this process's heartbeat.

        Raises:
          ConnectionClosed: Redis is unreachable (Dramatiq's consumer thread retries).
        """
        with self._lock:
            if self._pid != os.getpid():
                # A broker built before a fork: each process needs an id of its own, or a sibling's
                # beats would keep a dead process's messages from ever coming back.
                self.broker_id = str(uuid.uuid4())
                self._pid, self._consumed, self._heart = os.getpid(), set(), None
            self._consumed.add(queue_name)
            if self._heart is None:
                self._heart = _Heart(self, self.heartbeat_timeout / 1000 / BEATS_PER_TIMEOUT)
        try:
            self.beat()  # registers the queue before the first fetch: a kill right after it leaves nothing behind
        except redis.ConnectionError as e:
            raise ConnectionClosed(e) from None
        return super().consume(queue_name, prefetch, timeout)

    def beat(self, now_ms: int | None = None) -> tuple[int, int]:
        """Record this broker's heartbeat and consumed queues; requeue the messages of dead consumers.

        Parameters:
          now_ms: Injected clock, for tests (default: this host's clock, as Dramatiq's heartbeats).

        Returns:
          (messages requeued, dead consumers reaped).
        """
        with self._lock:
            broker_id, queues = self.broker_id, sorted(self._consumed)
        now = current_millis() if now_ms is None else now_ms
        args = [now, broker_id, self.heartbeat_timeout, REGISTRATION_TTL_MS, *queues]
        requeued, reaped = (int(n) for n in self._beat_script(keys=[self.namespace], args=args))
        if reaped:
            # Messages coming back mean a consumer died holding them; none is a consumer that stopped cleanly.
            logger.log(
                logging.WARNING if requeued else logging.INFO,
                "Requeued %d message(s) held by %d Redis consumer(s) silent for over %d ms.",
                requeued,
                reaped,
                self.heartbeat_timeout,
            )
        return requeued, reaped

    def close(self) -> None:
        """Stop heartbeating: messages still unacked come back to other consumers after the timeout."""
        heart, self._heart = self._heart, None
        if heart is not None:
            heart.stop()
        super().close()


class _Heart:
    """The heartbeat thread of one consuming process."""

    def __init__(self, broker: HeartbeatRedisBroker, interval_s: float) -> None:
        self._broker = broker
        self.interval_s = interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tenure-redis-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=2.0)

    def _run(self) -> None:
        failing = False
        while not self._stopped.wait(self.interval_s):
            try:
                self._broker.beat()
            except Exception as e:
                if not failing:  # once per outage: the consumers log their own connection errors
                    logger.warning("Redis heartbeat failed (%s); retrying every %.1f s.", e, self.interval_s)
                failing = True
                continue
            if failing:
                logger.info("Redis heartbeat restored.")
            failing = False


__all__ = ["DEFAULT_HEARTBEAT_TIMEOUT_MS", "HeartbeatRedisBroker"]
