"""Tenure's actors and the worker processes' composition root.

``dramatiq tasks`` (workers), ``periodiq tasks`` (scheduler) and the web app import this module:
it reads :class:`Settings` from the ``TENURE_*`` environment once, builds the broker
(``TENURE_BROKER_URL``: the SQLite file by default, Redis or RabbitMQ for a fleet), installs the
middleware in the order that matters — the job binding first, schedules before any periodic actor
is declared, metrics last — and then imports the actor modules so they declare themselves on that
broker. Tests configure it with environment variables, exactly like production.
"""

from __future__ import annotations

import dramatiq

import jobs
from broker import SQLiteBroker, make_broker
from monitoring.middleware import MetricsMiddleware
from settings.environment import Settings, set_current_settings

from .scheduling import configure as configure_schedules
from .scheduling import install as install_schedules

settings = Settings.from_env()
set_current_settings(settings)

if settings.broker_url.startswith("sqlite"):
    broker = SQLiteBroker(
        settings.broker_url,
        lease_ttl_ms=int(settings.broker_lease_ttl_s * 1000),
        busy_timeout_ms=settings.sqlite_busy_timeout_ms,
    )
else:
    broker = make_broker(settings.broker_url)
dramatiq.set_broker(broker)
if not isinstance(broker, SQLiteBroker):
    # Fire rows and schedule state live in the job database when the broker is a server.
    configure_schedules(broker, database_url=settings.database_url)

job_middleware = jobs.install(broker, settings)
install_schedules(broker)
broker.add_middleware(MetricsMiddleware())

# Actor modules declare themselves on the broker set above; import order is irrelevant among them.
from . import (  # noqa: E402,F401
    demo,
    import_recording,
    maintenance,
    notify,
    pipeline,
    render_clip,
    transcribe,
)

__all__ = ["broker", "job_middleware", "settings"]
