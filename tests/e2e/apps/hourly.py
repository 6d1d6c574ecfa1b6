"""An hourly schedule of a plain actor, declared by the e2e app (:mod:`.web_kinds`) and by the browser test
that plays a scheduler coming back after downtime on the same database (importing this registers no job kind)."""

from __future__ import annotations

import dramatiq

from tasks.scheduling import cron

QUEUE = "e2e"


def hourly_tick() -> None:
    """What the schedule sends: nothing to do (the schedules page shows its fire history)."""


def declare_hourly_tick(broker: dramatiq.Broker) -> dramatiq.Actor:
    """Declare the schedule on *broker* (its schedule middleware installed)."""
    return dramatiq.actor(hourly_tick, queue_name=QUEUE, broker=broker, periodic=cron("0 * * * *", name="hourly_tick"))
