"""Demo producer for `make run`: sends ``tasks.demo.hello`` once a second (until the web app lands)."""

from __future__ import annotations

import logging
import time

from tasks.demo import hello


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
