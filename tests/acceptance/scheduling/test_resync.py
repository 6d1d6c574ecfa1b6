"""The resync returns the message of a SIGKILLed worker to a worker that is already running."""

from __future__ import annotations

import time

import pytest
from dramatiq.message import Message

from broker import SQLiteBroker

from .conftest import Fleet

VICTIM_TTL_MS = 2_000
RESYNC_EVERY_S = 1


def log_rows(fleet: Fleet, kind: str, role: str) -> list[tuple[int, int | None, float]]:
    return fleet.query("SELECT pid, n, at FROM log WHERE kind = ? AND role = ? ORDER BY at", kind, role, log=True)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_resync_recovers_a_message_whose_worker_was_sigkilled(fleet: Fleet) -> None:
    # Given a scheduler firing the resync every second, and a worker (2 s leases) running a long job
    fleet.scheduler("scheduler", "fast_resync")
    victim = fleet.worker("victim", ["work"], SCHED_TEST_ROLE="victim", SCHED_TEST_LEASE_TTL_MS=str(VICTIM_TTL_MS))
    producer = SQLiteBroker(f"sqlite:///{fleet.db}", middleware=[])
    producer.declare_queue("work")
    producer.enqueue(Message(queue_name="work", actor_name="work", args=(1,), kwargs={}, options={}))
    producer.close()
    fleet.wait(lambda: log_rows(fleet, "work-start", "victim"), 30, "the victim to start the job")
    # And a second worker that never reclaims leases by itself within this test (hour-long lease
    # and reap interval), so only the resync can hand it the job
    fleet.worker(
        "rescuer",
        ["work", "maintenance"],
        SCHED_TEST_ROLE="rescuer",
        SCHED_TEST_SCHEDULES="fast_resync",
        SCHED_TEST_LEASE_TTL_MS="3600000",
        SCHED_TEST_REAP_S="3600",
    )
    fleet.wait(lambda: log_rows(fleet, "resync", "rescuer"), 30, "the rescuer to run a resync")
    # When the victim is SIGKILLed mid-job (and no worker restarts)
    fleet.kill(victim)
    killed_at = time.time()
    # Then the job completes on the running worker within the lease TTL plus a resync interval (+ load slack)
    ((_, n, done_at),) = fleet.wait(lambda: log_rows(fleet, "work-done", "rescuer"), 30, "the job to complete")
    assert n == 1
    assert done_at - killed_at < VICTIM_TTL_MS / 1000 + RESYNC_EVERY_S + 5
    # And it was the resync's reap that returned it (the resync logs what it reaped after the reap commits, so
    # on a busy machine the job it returned may finish first)
    fleet.wait(
        lambda: any((reaped or 0) >= 1 for _, reaped, _ in log_rows(fleet, "resync", "rescuer")),
        10,
        "the rescuer's resync to log the lease it reaped",
    )
    assert fleet.query("SELECT state FROM broker_messages WHERE actor = 'work'") in ([], [(0,)], [(1,)])
