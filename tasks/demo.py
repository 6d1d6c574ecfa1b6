"""A demo actor and producer for `make run` until the real actors land."""

from __future__ import annotations

import logging
import time

import dramatiq

logger = logging.getLogger(__name__)


@dramatiq.actor(queue_name="default", max_retries=3)
def hello(n: int) -> None:
    logger.info("hello #%d", n)


def produce_forever(interval_s: float = 1.0) -> None:
    n = 0
    while True:
        hello.send(n)
        n += 1
        time.sleep(interval_s)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print("demo producer: sending tasks.demo.hello once a second", flush=True)
    produce_forever()
