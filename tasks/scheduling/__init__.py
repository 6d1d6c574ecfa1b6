"""Exactly-once schedules around periodiq (docs/schedules.md).

Declare the periodiq way, with Tenure's declarations::

    from tasks.scheduling import cron, every, install

    install(broker)                      # before periodic actors are declared

    @dramatiq.actor(periodic=cron("0 3 * * *", tz="Europe/Paris"))
    def nightly_report(): ...

    @dramatiq.actor(periodic=every(seconds=30, max_staleness_s=30))
    def resync(): ...

    schedule_job("report", cron("0 6 * * 1"), payload={"scope": "weekly"})   # a job per tick

and run any number of ``periodiq tasks:compose`` processes: each tick fires once. The web UI calls
:func:`schedules`, :func:`history`, :func:`pause`, :func:`resume` and :func:`run_now`.
"""

from __future__ import annotations

import dramatiq
from dramatiq.broker import Broker
from sqlalchemy.orm import Session

from .declare import schedule_job
from .middleware import ScheduleMiddleware, install
from .runtime import configure, scheduler_for
from .scheduler import MESSAGE_OPTION, ScheduleNotFound, Scheduler, ScheduleView
from .specs import CronSchedule, IntervalSchedule, Schedule, ScheduledJob, cron, every
from .store import FireRecord


def schedules(broker: Broker | None = None) -> list[ScheduleView]:
    """Every schedule with its state (for the UI). Uses the global broker by default."""
    return scheduler_for(broker or dramatiq.get_broker()).list()


def history(per_schedule: int = 10, broker: Broker | None = None) -> dict[str, list[FireRecord]]:
    """The newest fires of every schedule (for the UI); see :meth:`Scheduler.history`."""
    return scheduler_for(broker or dramatiq.get_broker()).history(per_schedule)


def pause(name: str, *, by: str | None = None, broker: Broker | None = None, session: Session | None = None) -> bool:
    """Pause schedule *name* everywhere; see :meth:`Scheduler.pause` (*session*: a transaction to join)."""
    return scheduler_for(broker or dramatiq.get_broker()).pause(name, by=by, session=session)


def resume(name: str, *, broker: Broker | None = None, session: Session | None = None) -> bool:
    """Resume schedule *name*; see :meth:`Scheduler.resume`."""
    return scheduler_for(broker or dramatiq.get_broker()).resume(name, session=session)


def run_now(
    name: str, *, by: str | None = None, broker: Broker | None = None, session: Session | None = None
) -> FireRecord:
    """Fire schedule *name* once now; see :meth:`Scheduler.run_now`."""
    return scheduler_for(broker or dramatiq.get_broker()).run_now(name, by=by, session=session)


__all__ = [
    "MESSAGE_OPTION",
    "CronSchedule",
    "FireRecord",
    "IntervalSchedule",
    "Schedule",
    "ScheduledJob",
    "ScheduleMiddleware",
    "ScheduleNotFound",
    "ScheduleView",
    "Scheduler",
    "configure",
    "cron",
    "every",
    "history",
    "install",
    "pause",
    "resume",
    "run_now",
    "scheduler_for",
    "schedule_job",
    "schedules",
]
