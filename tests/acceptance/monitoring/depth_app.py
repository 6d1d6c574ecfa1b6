"""A Redis/RabbitMQ app for the queue-depth acceptance test: the web imports it, ``tenure worker`` runs it.

Environment: ``TENURE_BROKER_URL`` (``redis://…`` or ``amqp://…``), ``TENURE_TEST_REDIS_NAMESPACE``
(Redis keys of this test only; RabbitMQ gets a vhost of its own in the URL).
"""

from __future__ import annotations

import os
import time

import dramatiq

from broker import make_broker
from monitoring.middleware import MetricsMiddleware

QUEUE = "depth"

url = os.environ["TENURE_BROKER_URL"]
options = {"namespace": os.environ["TENURE_TEST_REDIS_NAMESPACE"]} if url.startswith("redis") else {}
broker = make_broker(url, **options)
broker.add_middleware(MetricsMiddleware())
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def drain(i: int) -> None:
    time.sleep(0.004)  # slow enough for a scrape to see the queue fall
