"""Workers skip a fired message only past its schedule's own max_staleness_s (periodiq skipped at 30 s)."""

from __future__ import annotations

import time

import dramatiq
from dramatiq import Worker

from broker import SQLiteBroker
from tasks.scheduling import MESSAGE_OPTION, every
from tasks.scheduling.scheduler import now_ms


def test_max_staleness_is_per_schedule_and_off_by_default(sched_broker: SQLiteBroker) -> None:
    ran: list[str] = []

    def make(name: str, spec):  # type: ignore[no-untyped-def]
        def fn(label: str) -> None:
            ran.append(label)

        return dramatiq.actor(fn, actor_name=name, queue_name="stale", broker=sched_broker, periodic=spec)

    strict = make("strict", every(seconds=60, max_staleness_s=5))
    lenient = make("lenient", every(seconds=60))

    def fired(actor, label: str, late_s: float) -> None:  # type: ignore[no-untyped-def]
        due = now_ms() - int(late_s * 1000)
        info = {"name": actor.actor_name, "fire_time": due, "due_at": due, "cause": "schedule"}
        sched_broker.enqueue(actor.message_with_options(args=(label,), **{MESSAGE_OPTION: info}))

    fired(strict, "strict-stale", 60)
    fired(strict, "strict-fresh", 1)
    fired(lenient, "lenient-very-stale", 3600)
    strict.send("strict-by-hand")  # sent without a schedule: never stale
    worker = Worker(sched_broker, worker_timeout=50, worker_threads=1)
    worker.start()
    try:
        sched_broker.join("stale", timeout=10_000)
        deadline = time.monotonic() + 5
        while len(ran) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        worker.stop()
    assert sorted(ran) == ["lenient-very-stale", "strict-by-hand", "strict-fresh"]
