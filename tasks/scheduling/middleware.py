"""``ScheduleMiddleware``: periodiq's middleware with Tenure's declarations and staleness rule.

It declares the ``periodic`` actor option (as ``periodiq.PeriodiqMiddleware`` does), so it must be
on the broker before periodic actors are declared (:func:`install`). On declaration it turns the
option into a Tenure declaration (periodiq's own ``cron()`` objects are accepted and read with
Tenure's cron math) and binds it to its actor and the process's scheduler. On the worker side it
replaces periodiq's silent 30-second ``skip_delay`` with the schedule's own ``max_staleness_s``
(none by default). Every process that declares a schedule exports its fire counters at 0
(``monitoring.metrics.declare_schedule``), so Prometheus sees the first fire as an increase.
"""

from __future__ import annotations

import logging
from typing import Any

from dramatiq.broker import Broker
from dramatiq.middleware import SkipMessage
from periodiq import PeriodiqMiddleware

from monitoring.metrics import declare_schedule

from .scheduler import MESSAGE_OPTION, now_ms
from .specs import DEFAULT_TZ, Binding, as_schedule

logger = logging.getLogger(__name__)


class ScheduleMiddleware(PeriodiqMiddleware):
    """Declares ``periodic=`` and applies per-schedule ``max_staleness_s`` in workers.

    Parameters:
      default_tz: Zone of cron schedules declared without ``tz``.
    """

    actor_options = {"periodic"}

    def __init__(self, default_tz: str = DEFAULT_TZ) -> None:
        # periodiq's skip_delay is deliberately not used: staleness is a per-schedule choice.
        super().__init__(skip_delay=None)
        self.default_tz = default_tz

    def after_declare_actor(self, broker: Broker, actor: Any) -> None:
        value = actor.options.get("periodic")
        if value is None:
            return
        from .runtime import scheduler_for

        spec = as_schedule(value)
        spec.bind(
            Binding(actor.actor_name, actor.queue_name, lambda: scheduler_for(broker)),
            default_tz=self.default_tz,
        )
        actor.options["periodic"] = spec
        declare_schedule(spec.schedule_name)

    def before_process_message(self, broker: Broker, message: Any) -> None:
        info = message.options.get(MESSAGE_OPTION)
        if not isinstance(info, dict):
            return  # not fired by a schedule (sent by hand): never stale
        actor = broker.actors.get(message.actor_name)
        spec = actor.options.get("periodic") if actor is not None else None
        limit = getattr(spec, "max_staleness_s", None)
        if limit is None:
            return
        late_ms = now_ms() - int(info.get("due_at", info.get("fire_time", 0)))
        if late_ms > limit * 1000:
            logger.warning(
                "Skipping %s tick %s: started %.1f s after it was due (max_staleness_s=%s).",
                info.get("name"),
                info.get("fire_time"),
                late_ms / 1000,
                limit,
            )
            raise SkipMessage()


def install(broker: Broker, *, default_tz: str = DEFAULT_TZ) -> ScheduleMiddleware:
    """Add :class:`ScheduleMiddleware` to *broker* unless it is there (idempotent).

    Call it before periodic actors are declared: Dramatiq refuses an undeclared actor option.

    Returns:
      The broker's schedule middleware.
    """
    for middleware in broker.middleware:
        if isinstance(middleware, ScheduleMiddleware):
            return middleware
    middleware = ScheduleMiddleware(default_tz=default_tz)
    broker.add_middleware(middleware)
    return middleware
