"""The 30-second resync: the maintenance actor every deployment runs.

Each run, in this order, every step on its own (one failing step is logged and the others still
run, and the next tick tries again):

1. reclaim expired broker leases (``SQLiteBroker.reap``; Redis/RabbitMQ redeliver by themselves);
2. recover running jobs whose lease expired (the job layer's ``jobs.recovery.recover_expired``);
3. republish pending outbox rows (the job layer's relay; only with a server broker, where there is an outbox);
4. prune what is kept only for a while: finished jobs and events (job layer), dead letters past
   their TTL (``broker.purge_dead``), schedule fire rows past their retention (each schedule's
   latest fire row is always kept);
5. refresh the schedules' view (declared text, next tick) that the UI and metrics read;
6. remove the scratch directories of renders whose worker was killed (``tasks.outputs``).

Every step is a guarded statement (an expired lease is reclaimed once, a row is deleted once), so
two runs at the same time, or a run repeated, change nothing more than one run.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.broker import Broker

from broker import SQLiteBroker
from jobs.outbox import relay_once
from jobs.recovery import recover_expired
from jobs.settings import current_settings

from .outputs import clean_partial_outputs
from .scheduling import every, install, scheduler_for

logger = logging.getLogger(__name__)

#: How often the resync runs, in seconds.
RESYNC_PERIOD_S = 30
#: A resync message that could not start within this is skipped (the next tick is close), in seconds.
RESYNC_MAX_STALENESS_S = 25
#: How long fire rows are kept, in seconds (the latest per schedule is kept forever).
DEFAULT_FIRE_RETENTION_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class MaintenanceConfig:
    """Retention and timing of the resync (from ``Settings``; see :func:`configure_maintenance`).

    Parameters:
      fire_retention_s: Keep schedule fire rows this long.
      job_retention_s: Keep finished jobs this long (None: the job layer's default).
      event_retention_s: Keep job events this long (None: the job layer's default).
      dead_letter_retention_ms: Keep dead letters this long (None: the broker's own TTL).
    """

    fire_retention_s: float = DEFAULT_FIRE_RETENTION_S
    job_retention_s: float | None = None
    event_retention_s: float | None = None
    dead_letter_retention_ms: int | None = None


@dataclass(frozen=True)
class ResyncReport:
    """What one resync did; None means the step does not apply here (or its layer is not there yet)."""

    leases_reaped: int | None = None
    jobs_recovered: int | None = None
    outbox_republished: int | None = None
    jobs_pruned: int | None = None
    dead_letters_purged: int | None = None
    fires_pruned: int | None = None
    schedules_refreshed: int | None = None
    errors: tuple[str, ...] = field(default=())
    partials_removed: int | None = None


_config = MaintenanceConfig()


def configure_maintenance(config: MaintenanceConfig) -> None:
    """Set the resync's retention and timing for this process (at start, from Settings)."""
    global _config
    _config = config


def run_resync(broker: Broker, *, config: MaintenanceConfig | None = None) -> ResyncReport:
    """Run every resync step once against *broker* and the schedule/job database.

    Parameters:
      broker: The broker (a SQLiteBroker gets its leases reaped and dead letters purged).
      config: Retention and timing; the process's configured one by default.

    Returns:
      Counts per step; steps that failed are listed in ``errors`` (and logged), never raised.
    """
    config = config or _config
    errors: list[str] = []
    sqlite = isinstance(broker, SQLiteBroker)

    def step(name: str, fn: Callable[[], int | None]) -> int | None:
        try:
            return fn()
        except Exception as e:  # one broken step must not stop the others
            logger.exception("Resync step %s failed.", name)
            errors.append(f"{name}: {type(e).__name__}: {e}"[:300])
            return None

    scheduler = scheduler_for(broker)
    engine = scheduler.engine
    config = step("runtime_settings", lambda: runtime_retention(engine, config)) or config  # type: ignore[arg-type]
    reaped = step("reap", lambda: broker.reap()) if sqlite else None  # type: ignore[attr-defined]
    recovered = step("recover", lambda: recover_expired(engine, broker=broker).total)
    # With the SQLite broker on the job database a job's message is written in its own transaction
    # and there is no outbox; otherwise the relay process publishes, and this is its safety net.
    republished = None if scheduler.transactional else step("outbox", lambda: relay_once(engine, broker))
    # TODO(jobs): a retention API (finished jobs, events, published outbox rows); called when it exists.
    jobs_pruned = step(
        "prune_jobs",
        lambda: _job_layer(
            "retention",
            "prune",
            engine,
            job_retention_s=config.job_retention_s,
            event_retention_s=config.event_retention_s,
        ),
    )
    purged = (
        step("purge_dead", lambda: broker.purge_dead(config.dead_letter_retention_ms))  # type: ignore[attr-defined]
        if sqlite
        else None
    )
    fires = step("prune_fires", lambda: scheduler.prune_fires(config.fire_retention_s))
    refreshed = step("refresh_schedules", scheduler.refresh)
    # Scratch directories of renders whose worker was killed (tasks.outputs).
    partials = step("clean_partials", lambda: clean_partial_outputs(engine, Path(current_settings().output_root)))
    report = ResyncReport(
        reaped, recovered, republished, jobs_pruned, purged, fires, refreshed, tuple(errors), partials_removed=partials
    )
    if reaped or recovered or republished:
        logger.info("Resync: %s", report)
    else:
        logger.debug("Resync: %s", report)
    return report


def runtime_retention(engine: Any, config: MaintenanceConfig) -> MaintenanceConfig:
    """*config* with the retention keys an admin saved (``jobs.runtime_settings``) applied, if present.

    ``retention.finished_jobs_days``, ``retention.events_days`` and ``retention.dead_letters_days``
    override the configured values from the next resync on; a key that was never saved (or saved as
    null) leaves the configured value.
    """
    from jobs.runtime_settings import saved_values

    saved = saved_values(engine)
    day_s = 24 * 3600.0
    changes: dict[str, Any] = {}
    for key, attr, scale in (
        ("retention.finished_jobs_days", "job_retention_s", day_s),
        ("retention.events_days", "event_retention_s", day_s),
        ("retention.dead_letters_days", "dead_letter_retention_ms", day_s * 1000),
    ):
        days = saved.get(key)
        if isinstance(days, int) and not isinstance(days, bool) and days > 0:
            value = days * scale
            changes[attr] = int(value) if attr.endswith("_ms") else value
    return replace(config, **changes) if changes else config


_missing_logged: set[str] = set()


def _job_layer(module: str, function: str, *args: Any, **kwargs: Any) -> int | None:
    """Call ``jobs.<module>.<function>`` when the job layer provides it; None when it does not (yet)."""
    try:
        fn = getattr(importlib.import_module(f"jobs.{module}"), function)
    except (ImportError, AttributeError):
        if module not in _missing_logged:
            _missing_logged.add(module)
            logger.info("Resync: jobs.%s.%s is not available; step skipped.", module, function)
        return None
    result = fn(*args, **kwargs)
    return result if isinstance(result, int) else None


# Declaring ``periodic=`` needs the schedule middleware on the broker first (idempotent).
install(dramatiq.get_broker())


@dramatiq.actor(
    queue_name="maintenance",
    max_retries=0,  # the next tick is the retry
    time_limit=60_000,
    periodic=every(
        seconds=RESYNC_PERIOD_S,
        catchup="latest",
        grace_s=RESYNC_PERIOD_S,
        max_staleness_s=RESYNC_MAX_STALENESS_S,
    ),
)
def resync() -> None:
    """The scheduled resync (every 30 s, sub-minute, exactly once per tick across schedulers)."""
    run_resync(resync.broker)
