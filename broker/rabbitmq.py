"""TimestampedRabbitmqBroker: Dramatiq's RabbitmqBroker whose messages carry the AMQP ``timestamp`` property.

Dramatiq publishes with ``delivery_mode`` and ``priority`` only. RabbitMQ's management API reports the
age of a queue's oldest message (``head_message_timestamp``) only from that property, so without it
no lag can be read from RabbitMQ. This subclass stamps each message it publishes with the time it is
*due*, in whole seconds: the later of its ``message_timestamp`` and its ``eta`` — the moment from which
it waits, as the Redis broker's lag counts it (:mod:`broker.depth`). A delayed message is stamped
again when a worker moves it from the delay queue to its queue, at its eta. Messages, queues,
consumers and everything else are Dramatiq's.

It also carries the management API client (:class:`broker.rabbitmq_management.ManagementApi`) that
:func:`broker.depth.queue_depths` reads in-flight counts and the lag from, when given its URL.
"""

from __future__ import annotations

import threading
from typing import Any

import pika
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.common import current_millis
from dramatiq.message import Message

from .hooks import HookDispatch
from .rabbitmq_management import ManagementApi


class TimestampedRabbitmqBroker(HookDispatch, RabbitmqBroker):
    """Dramatiq's RabbitmqBroker, stamping the AMQP ``timestamp`` of what it publishes.

    Parameters:
      management_url: RabbitMQ's management API (``http(s)://host:15672``); ``None``: not used. Without
        credentials of its own, the connection's are used.
      **kwargs: Dramatiq's ``RabbitmqBroker`` arguments.
    """

    def __init__(self, *, management_url: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._due = threading.local()
        self.management = (
            None if management_url is None else ManagementApi.for_connection(management_url, self.parameters)
        )

    def enqueue(self, message: Message, *, delay: int | None = None) -> Message:
        # Dramatiq builds the publish properties inside enqueue: the channel it publishes on reads this.
        self._due.ms = max(int(message.message_timestamp), int(message.options.get("eta") or 0))
        try:
            return super().enqueue(message, delay=delay)
        finally:
            self._due.ms = None

    @property
    def channel(self) -> Any:
        return _StampingChannel(RabbitmqBroker.channel.fget(self), self._due)  # type: ignore[attr-defined]

    @channel.deleter
    def channel(self) -> None:
        RabbitmqBroker.channel.fdel(self)  # type: ignore[attr-defined]


class _StampingChannel:
    """A pika channel whose ``basic_publish`` sets the ``timestamp`` property when the publisher did not."""

    __slots__ = ("_channel", "_due")

    def __init__(self, channel: Any, due: threading.local) -> None:
        self._channel = channel
        self._due = due

    def basic_publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: pika.BasicProperties | None = None,
        mandatory: bool = False,
    ) -> None:
        properties = properties or pika.BasicProperties()
        if properties.timestamp is None:
            properties.timestamp = (getattr(self._due, "ms", None) or current_millis()) // 1000
        self._channel.basic_publish(
            exchange=exchange, routing_key=routing_key, body=body, properties=properties, mandatory=mandatory
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)
