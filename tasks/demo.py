"""A demo actor and producer for `make run` until the real actors land."""

from __future__ import annotations

import logging

import dramatiq

logger = logging.getLogger(__name__)


@dramatiq.actor(queue_name="default", max_retries=3)
def hello(n: int) -> None:
    logger.info("hello #%d", n)
