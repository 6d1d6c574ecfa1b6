"""A Redis/RabbitMQ app for the queue-depth acceptance test: the web imports it, ``tenure worker`` runs it.

Environment: the ``TENURE_*`` settings (``TENURE_BROKER_URL``: ``redis://…`` or ``amqp://…``;
``TENURE_RABBITMQ_MANAGEMENT_URL`` with RabbitMQ), ``TENURE_TEST_REDIS_NAMESPACE`` (Redis keys of this
test only; RabbitMQ gets a vhost of its own in the URL) and ``DEPTH_GATE``: a file each message waits
for before it is done (so the test sees messages in flight for as long as it likes).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dramatiq

from broker import make_broker
from monitoring.middleware import MetricsMiddleware
from settings.environment import Settings

QUEUE = "depth"

settings = Settings.from_env()
options = {"namespace": os.environ["TENURE_TEST_REDIS_NAMESPACE"]} if settings.broker_url.startswith("redis") else {}
broker = make_broker(settings.broker_url, rabbitmq_management_url=settings.rabbitmq_management_url, **options)
broker.add_middleware(MetricsMiddleware())
dramatiq.set_broker(broker)
GATE = Path(os.environ["DEPTH_GATE"])


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def drain(i: int) -> None:
    while not GATE.exists():
        time.sleep(0.01)
    time.sleep(0.004)  # slow enough for a scrape to see the queue fall
