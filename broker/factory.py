"""Choose a Dramatiq broker from a URL: the SQLite default, PostgreSQL (:mod:`broker.postgres`), Redis
(Dramatiq's broker plus a heartbeat thread, :mod:`broker.redis_heartbeat`, and wake-ups,
:mod:`broker.redis_wakeup`) or RabbitMQ (Dramatiq's broker stamping publish times, :mod:`broker.rabbitmq`)."""

from __future__ import annotations

from typing import Any

from dramatiq.broker import Broker
from dramatiq.middleware import Middleware


def make_broker(
    url: str,
    middleware: list[Middleware] | None = None,
    *,
    rabbitmq_management_url: str | None = None,
    **options: Any,
) -> Broker:
    """Build the broker for *url*.

    ``sqlite:///path`` → :class:`broker.SQLiteBroker`; ``postgresql://…`` (or ``postgres://``) →
    :class:`broker.postgres.PostgresBroker` (leased rows in that database); ``redis://…`` →
    :class:`broker.redis_wakeup.WakingRedisBroker` (a dead consumer's messages are back within
    ``heartbeat_timeout``, default 5 s, plus a second; an idle consumer wakes within milliseconds of an
    enqueue); ``amqp://…`` →
    :class:`broker.rabbitmq.TimestampedRabbitmqBroker`, Dramatiq's ``RabbitmqBroker`` stamping each
    message's due time (RabbitMQ requeues a consumer's unacked messages as soon as its connection
    closes, which a killed process's does at once). *rabbitmq_management_url* (RabbitMQ's management
    API, where queue depth reads in-flight counts and the lag) is used with ``amqp://`` URLs only.
    Extra keyword options go to the broker class.

    Raises:
      ValueError: For an unknown scheme.
    """
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        from .sqlite import SQLiteBroker

        return SQLiteBroker(url, middleware, **options)
    if scheme.split("+", 1)[0] in ("postgresql", "postgres"):
        from .postgres import PostgresBroker

        return PostgresBroker(url, middleware, **options)
    if scheme in ("redis", "rediss"):
        from .redis_wakeup import WakingRedisBroker

        return WakingRedisBroker(url=url, middleware=middleware, **options)
    if scheme in ("amqp", "amqps"):
        from .rabbitmq import TimestampedRabbitmqBroker

        return TimestampedRabbitmqBroker(
            url=url, middleware=middleware, management_url=rabbitmq_management_url, **options
        )
    raise ValueError(f"unsupported broker URL scheme {scheme!r}: use sqlite://, postgresql://, redis:// or amqp://")
