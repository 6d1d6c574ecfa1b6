"""Tenure's actors, and :func:`compose`, the composition root of every process that runs them.

Importing this package (or any module in it) reads no environment and builds no broker: the actor
modules declare their job kinds in the job layer's registry, nothing more. A process composes itself
by calling :func:`compose` — ``tenure worker tasks:compose`` and ``periodiq tasks:compose`` name it as
their broker argument (Dramatiq calls it, then uses the broker it set), the web app calls it at start.
It reads :class:`settings.environment.Settings` from the ``TENURE_*`` environment once, builds the
broker (``TENURE_BROKER_URL``: the SQLite file by default, Redis or RabbitMQ for a fleet), turns tracing on
when ``TENURE_TRACING`` says so (:mod:`monitoring.tracing`), installs the
middleware in the order that matters — the job binding first, schedules before any periodic actor is
declared, metrics last — and declares every kind's actor and the resync on that broker.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import dramatiq
from dramatiq.broker import Broker
from sqlalchemy import Engine

import accounts
import jobs
from broker import SQLiteBroker, make_broker
from jobs import admission_policy
from jobs.execution.binding import JobMiddleware
from monitoring.middleware import MetricsMiddleware
from monitoring.tracing import configure_tracing
from settings.environment import Settings, set_current_settings

from . import import_recording, maintenance, notify, pipeline, render_clip, transcribe
from .scheduling import configure as configure_schedules
from .scheduling import install as install_schedules

#: The actor modules (each declares its kinds when imported).
ACTOR_MODULES = (import_recording, notify, pipeline, render_clip, transcribe)


@dataclass(frozen=True)
class Composition:
    """What :func:`compose` built for this process."""

    settings: Settings
    broker: Broker
    job_middleware: JobMiddleware


_composed: Composition | None = None


def build_broker(settings: Settings) -> Broker:
    """The broker of ``settings.broker_url``: the SQLite or PostgreSQL lease broker (with the settings' lease
    TTL), or Redis/RabbitMQ (:func:`broker.make_broker`; RabbitMQ with ``settings.rabbitmq_management_url``)."""
    lease_ttl_ms = int(settings.broker_lease_ttl_s * 1000)
    if settings.broker_url.startswith("sqlite"):
        return SQLiteBroker(
            settings.broker_url, lease_ttl_ms=lease_ttl_ms, busy_timeout_ms=settings.sqlite_busy_timeout_ms
        )
    if settings.broker_url.startswith("postgres"):
        return make_broker(settings.broker_url, lease_ttl_ms=lease_ttl_ms)
    return make_broker(settings.broker_url, rabbitmq_management_url=settings.rabbitmq_management_url)


def _owner_ids(engine: Engine, names: Sequence[str]) -> dict[str, str]:
    found = {name: accounts.owner_id_of(engine, name) for name in names}
    return {name: owner for name, owner in found.items() if owner is not None}


def compose(settings: Settings | None = None) -> Composition:
    """Compose this process once: settings, broker, middleware, actors (later calls return the same).

    Parameters:
      settings: Default: :meth:`Settings.from_env` (the ``TENURE_*`` environment).
    """
    global _composed
    if _composed is not None and (settings is None or settings == _composed.settings):
        return _composed
    settings = settings or Settings.from_env()
    set_current_settings(settings)
    configure_tracing(settings)  # before any engine is made: the SQLAlchemy instrumentation wraps their creation
    broker = build_broker(settings)
    dramatiq.set_broker(broker)
    if not isinstance(broker, SQLiteBroker):
        # Fire rows and schedule state live in the job database when the broker is a server.
        configure_schedules(broker, database_url=settings.database_url)
    job_middleware = jobs.install(broker, settings)
    # Fair-share weights name owners by user name; jobs carry owner ids.
    admission_policy.resolve_owners = functools.partial(_owner_ids, job_middleware.engine)
    install_schedules(broker)
    transcribe.install(broker)
    broker.add_middleware(MetricsMiddleware())
    jobs.registry.bind(broker)
    maintenance.declare_resync(broker)
    _composed = Composition(settings, broker, job_middleware)
    return _composed


__all__ = ["ACTOR_MODULES", "Composition", "build_broker", "compose"]
