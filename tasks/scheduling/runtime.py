"""One scheduler per broker per process, created on first use (never at import time)."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from dramatiq.broker import Broker
from sqlalchemy.engine import Engine

from broker import SQLiteBroker
from jobs.db import make_engine
from settings.environment import current_settings

from .scheduler import Clock, Scheduler, now_ms

_lock = threading.Lock()
_schedulers: dict[tuple[int, int], Scheduler] = {}
_configs: dict[int, _Config] = {}


@dataclass(frozen=True)
class _Config:
    engine: Engine | None
    database_url: str | None
    clock: Clock


def configure(
    broker: Broker,
    *,
    engine: Engine | None = None,
    database_url: str | None = None,
    clock: Clock = now_ms,
) -> Scheduler:
    """Set the scheduler of *broker* in this process and in processes forked from it.

    Parameters:
      broker: The broker periodic actors are declared on.
      engine: The schedule database; or give ``database_url``. With neither, a SQLiteBroker's own file.
      database_url: SQLAlchemy URL of the schedule database (``TENURE_DATABASE_URL``).
      clock: Epoch-ms clock (tests inject one).

    Raises:
      settings.environment.SettingsError: No database given, a server broker, and invalid ``TENURE_*`` settings.

    Returns:
      The scheduler now used by this process for *broker*.
    """
    config = _Config(engine, database_url, clock)
    scheduler = _build(broker, config)
    with _lock:
        _configs[id(broker)] = config
        _schedulers[(id(broker), os.getpid())] = scheduler
    return scheduler


def scheduler_for(broker: Broker) -> Scheduler:
    """The scheduler of *broker* in this process (built on first use, again after a fork).

    Raises:
      settings.environment.SettingsError: A server broker never configured, and invalid ``TENURE_*`` settings.
    """
    key = (id(broker), os.getpid())
    with _lock:
        scheduler = _schedulers.get(key)
        config = _configs.get(id(broker), _Config(None, None, now_ms))
    if scheduler is None:
        scheduler = _build(broker, config, forked=True)
        with _lock:
            scheduler = _schedulers.setdefault(key, scheduler)
    return scheduler


def _build(broker: Broker, config: _Config, *, forked: bool = False) -> Scheduler:
    engine = config.engine
    if engine is not None:
        if forked:
            engine.dispose(close=False)  # the parent's pooled connections must not cross a fork
    else:
        url = config.database_url
        if url is None:
            # The SQLite broker's own file holds the schedule tables (one transaction for a fire and
            # its message); with a server broker, the job database from Settings does.
            if isinstance(broker, SQLiteBroker):
                url = f"sqlite:///{broker.target.path}"
            else:
                url = current_settings().database_url
        engine = make_engine(url)
    return Scheduler(broker, engine, clock=config.clock)
