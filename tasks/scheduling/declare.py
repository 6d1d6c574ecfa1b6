"""``schedule_job``: a schedule whose ticks submit jobs (with the job layer's records and retries)."""

from __future__ import annotations

from typing import Any

import dramatiq
from dramatiq.broker import Broker

from .runtime import scheduler_for
from .specs import Schedule, ScheduledJob

#: Queue of the trigger actors (only a message sent by hand ever lands there).
TRIGGER_QUEUE = "schedules"


def schedule_job(
    kind: str,
    spec: Schedule,
    *,
    owner_id: str = "scheduler",
    payload: dict[str, Any] | None = None,
    broker: Broker | None = None,
) -> Any:
    """Declare a schedule that submits a job of *kind* on each tick.

    The fire row, the job, its idempotency key (``schedule:<name>:<tick>``) and its message (or
    outbox row) are written in one transaction. The schedule is a periodic "trigger" actor named
    ``spec.name`` or ``schedule.<kind>``, so ``periodiq`` finds it like any other schedule.

    Parameters:
      kind: A job kind registered with ``jobs.registry`` (checked when a tick fires).
      spec: ``cron(...)`` or ``every(...)``.
      owner_id: Owner of the jobs (their idempotency keys are scoped by it).
      payload: The jobs' payload.
      broker: The broker to declare the trigger actor on (default: the global one).

    Returns:
      The trigger actor (sending it by hand runs the schedule once, like :func:`run_now`).
    """
    spec.job = ScheduledJob(kind, owner_id, dict(payload or {}))
    actor_name = spec.name or f"schedule.{kind}"

    def trigger() -> None:
        # Only a message sent by hand gets here: Tenure's scheduler submits the job directly.
        scheduler_for(actor.broker).run_now(spec.schedule_name, by="trigger")

    trigger.__name__ = actor_name
    actor = dramatiq.actor(trigger, actor_name=actor_name, queue_name=TRIGGER_QUEUE, broker=broker, periodic=spec)
    return actor
