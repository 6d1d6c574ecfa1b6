"""The worker module of the broker benchmark: ``python -m dramatiq bench.app``.

The broker comes from the environment (set by :mod:`bench.broker_bench`):

* ``BENCH_BROKER_URL`` — ``sqlite:////abs/path.db`` | ``redis://…`` | ``amqp://…`` (via ``broker.make_broker``);
* ``BENCH_BROKER_OPTIONS`` — JSON keyword options for the broker class (e.g. ``{"synchronous": "FULL"}``);
* ``BENCH_LEDGER_DIR`` — where the actor records what it ran (see :mod:`bench.ledger`).

Every broker gets Dramatiq's default middleware and the same no-op actor, which only records
``time.time() - stamp`` and a count in a per-process shared-memory ledger.
"""

from __future__ import annotations

import json
import os
from typing import Any

import dramatiq
from dramatiq.broker import Broker

from broker import make_broker

from .ledger import LedgerWriter

QUEUE = "tenure_bench"
ACTOR = "bench_noop"


#: ``BENCH_ROUND_TRIP=1`` (SQLite broker only): each call also waits for one empty write in the broker's
#: ack writer (``write_with_acks``) — the hand-off a job's claim makes — to measure what that costs alone.
ROUND_TRIP = os.environ.get("BENCH_ROUND_TRIP") == "1"


def _nothing(conn: Any) -> None:
    return None


def bench_noop(stamp: float) -> None:
    """The benchmark's actor: wait for the start gate (drain runs), then record the delivery."""
    ledger = LedgerWriter.for_this_process(os.environ["BENCH_LEDGER_DIR"])
    ledger.wait_for_go()
    if ROUND_TRIP:
        dramatiq.get_broker().write_with_acks(QUEUE, _nothing)  # type: ignore[attr-defined]
    ledger.record(stamp)


def build_broker(url: str, options: dict[str, Any] | None = None) -> Broker:
    return make_broker(url, **(options or {}))


def declare_actor(broker: Broker) -> dramatiq.Actor:
    return dramatiq.actor(bench_noop, broker=broker, actor_name=ACTOR, queue_name=QUEUE)


noop: dramatiq.Actor | None = None
if os.environ.get("BENCH_BROKER_URL"):
    _broker = build_broker(os.environ["BENCH_BROKER_URL"], json.loads(os.environ.get("BENCH_BROKER_OPTIONS", "{}")))
    dramatiq.set_broker(_broker)
    noop = declare_actor(_broker)
