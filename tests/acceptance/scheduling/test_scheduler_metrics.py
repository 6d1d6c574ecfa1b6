"""``tenure scheduler --metrics-port``: periodiq's scheduler serving its own process's metrics."""

from __future__ import annotations

import sys

import pytest

from tests.acceptance.monitoring.support import free_port, scrape, total

from .conftest import Fleet


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_the_scheduler_counts_what_it_fires_on_its_own_port(fleet: Fleet) -> None:
    # Given: `tenure scheduler` (periodiq) with a one-second schedule and a metrics port
    port = free_port()
    argv = [sys.executable, "-m", "tenure_cli", "scheduler", "tests.acceptance.scheduling.metrics_app"]
    fleet.start("scheduler", [*argv, "--metrics-port", str(port)], SCHED_TEST_SCHEDULES="tick")
    url = f"http://127.0.0.1:{port}/metrics"

    def enqueued() -> float:
        try:
            return total(scrape(url), "tenure_messages_enqueued_total", queue="ticks", actor="tick")
        except OSError:
            return -1

    def fires() -> int:
        return fleet.query("SELECT count(*) FROM schedule_fires WHERE schedule = 'tick'")[0][0]

    # Then: every fire's message is counted on the scheduler's own port
    fleet.wait(lambda: enqueued() >= 3, 30, "three fires counted on the scheduler's port")
    fleet.wait(lambda: enqueued() == fires(), 10, "the port's count equal to the fire rows")
