"""Choose a Dramatiq broker from a URL: the SQLite default, or Dramatiq's own Redis/RabbitMQ brokers."""

from __future__ import annotations

from typing import Any

from dramatiq.broker import Broker
from dramatiq.middleware import Middleware


def make_broker(url: str, middleware: list[Middleware] | None = None, **options: Any) -> Broker:
    """Build the broker for *url*.

    ``sqlite:///path`` → :class:`broker.SQLiteBroker`; ``redis://…`` → Dramatiq's ``RedisBroker``;
    ``amqp://…`` → Dramatiq's ``RabbitmqBroker``. Extra keyword options go to the broker class.

    Raises:
      ValueError: For an unknown scheme.
    """
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        from .sqlite import SQLiteBroker

        return SQLiteBroker(url, middleware, **options)
    if scheme in ("redis", "rediss"):
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(url=url, middleware=middleware, **options)
    if scheme in ("amqp", "amqps"):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=url, middleware=middleware, **options)
    raise ValueError(f"unsupported broker URL scheme {scheme!r}: use sqlite://, redis:// or amqp://")
