"""Run the job acceptance suite's apps on RabbitMQ without changing them.

``tests/acceptance/jobs`` builds ``dramatiq.brokers.redis.RedisBroker(url=TENURE_BROKER_URL, …)`` for
every non-SQLite backend. :func:`install` makes that name build Dramatiq's ``RabbitmqBroker`` when the
URL is ``amqp://…`` (Redis URLs still get a real ``RedisBroker``), so the same apps, client and
assertions run on RabbitMQ + PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import dramatiq.brokers.redis


def redis_or_rabbitmq(redis_broker: Any) -> Any:
    """A stand-in for the ``RedisBroker`` class *redis_broker* that serves ``amqp://`` URLs with RabbitMQ."""

    def make(*args: Any, url: str | None = None, middleware: Any = None, **options: Any) -> Any:
        if url is not None and url.startswith(("amqp://", "amqps://")):
            from dramatiq.brokers.rabbitmq import RabbitmqBroker

            return RabbitmqBroker(url=url, middleware=middleware)
        return redis_broker(*args, url=url, middleware=middleware, **options)

    return make


def install() -> None:
    """In a subprocess: patch ``dramatiq.brokers.redis.RedisBroker`` before the app is imported."""
    dramatiq.brokers.redis.RedisBroker = redis_or_rabbitmq(dramatiq.brokers.redis.RedisBroker)  # type: ignore[misc]
