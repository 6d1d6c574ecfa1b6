"""The 30-second resync: the maintenance actor every deployment runs.

Each run, in this order, every step on its own (one failing step is logged and the others still
run, and the next tick tries again):

1. reclaim expired broker leases (``SQLiteBroker.reap``; Redis/RabbitMQ redeliver by themselves);
2. recover running jobs whose lease expired (the job layer's ``jobs.recovery.recover_expired``);
3. republish pending outbox rows (the job layer's relay; only with a server broker, where there is an outbox);
4. prune what is kept only for a while: finished jobs, their events and published outbox rows
   (``jobs.retention.prune``: per-status retention, workflows whole, retried jobs kept while their
   retry is), dead letters (``broker.purge_dead``), schedule fire rows (each schedule's latest fire
   row is always kept), audit log rows (``accounts.audit.prune``). Retention is read on every run:
   ``TENURE_RETENTION_*`` overlaid by the saved runtime settings ``retention.*`` (:func:`retention_in_force`);
5. refresh the schedules' declared text that the UI reads (the next tick is the scheduler's to write);
6. remove the scratch directories of renders whose worker was killed (``tasks.outputs``).

Every step is a guarded statement (an expired lease is reclaimed once, a row is deleted once), so
two runs at the same time, or a run repeated, change nothing more than one run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import dramatiq
from dramatiq.broker import Broker

from accounts import audit
from broker import SQLiteBroker
from jobs.admission import admit_waiting
from jobs.outbox import relay_once
from jobs.recovery import recover_expired
from jobs.redelivery import republish_lost
from jobs.retention import DAY_S, RetentionPolicy, effective_policy, prune
from monitoring.metrics import record_pruned
from settings.environment import Settings, current_settings
from settings.runtime import effective_values

from .outputs import clean_partial_outputs
from .scheduling import every, install, scheduler_for

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: How often the resync runs, in seconds.
RESYNC_PERIOD_S = 30
#: A resync message that could not start within this is skipped (the next tick is close), in seconds.
RESYNC_MAX_STALENESS_S = 25


@dataclass(frozen=True)
class MaintenanceConfig:
    """Explicit retention for the resync (embedders and tests); a None field means "what is in force":
    the saved runtime setting, else its ``TENURE_RETENTION_*`` variable, else the default.

    Parameters:
      fire_retention_s: Keep schedule fire rows this long.
      dead_letter_retention_ms: Keep dead letters this long.
      retention: Finished jobs, events and published outbox rows (:class:`jobs.retention.RetentionPolicy`).
      audit_retention_s: Keep audit log rows this long.
    """

    fire_retention_s: float | None = None
    dead_letter_retention_ms: int | None = None
    retention: RetentionPolicy | None = None
    audit_retention_s: float | None = None


@dataclass(frozen=True)
class Retention:
    """The retention one resync applies (see :func:`retention_in_force`)."""

    jobs: RetentionPolicy
    fire_retention_s: float
    dead_letter_retention_ms: int
    audit_retention_s: float


@dataclass(frozen=True)
class ResyncReport:
    """What one resync did; None means the step does not apply here (or it failed: see ``errors``)."""

    leases_reaped: int | None = None
    jobs_recovered: int | None = None
    outbox_republished: int | None = None
    jobs_pruned: int | None = None
    dead_letters_purged: int | None = None
    fires_pruned: int | None = None
    schedules_refreshed: int | None = None
    errors: tuple[str, ...] = field(default=())
    partials_removed: int | None = None
    events_pruned: int | None = None
    outbox_pruned: int | None = None
    audit_pruned: int | None = None


_config = MaintenanceConfig()


def configure_maintenance(config: MaintenanceConfig) -> None:
    """Set explicit retention for this process's resyncs (embedders; by default the settings in force apply)."""
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

    def step(name: str, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except Exception as e:  # one broken step must not stop the others
            logger.exception("Resync step %s failed.", name)
            errors.append(f"{name}: {type(e).__name__}: {e}"[:300])
            return None

    scheduler = scheduler_for(broker)
    engine = scheduler.engine
    settings = current_settings()
    # Without the runtime settings (database trouble) the environment's values still apply.
    retention = step("runtime_settings", lambda: retention_in_force(engine, config, settings)) or Retention(
        config.retention or RetentionPolicy(),
        config.fire_retention_s or settings.retention_fires_days * DAY_S,
        config.dead_letter_retention_ms or int(settings.retention_dead_letters_days * DAY_S * 1000),
        config.audit_retention_s or settings.retention_audit_days * DAY_S,
    )
    reaped = step("reap", lambda: broker.reap()) if sqlite else None  # type: ignore[attr-defined]
    recovered = step("recover", lambda: recover_expired(engine, broker=broker).total)
    # Jobs waiting for admission that could go (a crash between a release and its admissions).
    step("admit_waiting", lambda: admit_waiting(engine, broker))
    # With the SQLite broker on the job database a job's message is written in its own transaction
    # and there is no outbox; otherwise the relay process publishes, and this is its safety net.
    republished = None if scheduler.transactional else step("outbox", lambda: relay_once(engine, broker))
    if not scheduler.transactional:
        # Messages a server broker lost since (a Redis restarted without persistence): written again.
        lease_ms = int(settings.job_lease_ttl_s * 1000)
        step("republish_lost", lambda: republish_lost(engine, broker, min_age_ms=lease_ms))
    pruned = step("prune_jobs", lambda: prune(engine, retention.jobs))
    purged = (
        step("purge_dead", lambda: broker.purge_dead(retention.dead_letter_retention_ms))  # type: ignore[attr-defined]
        if sqlite
        else None
    )
    fires = step("prune_fires", lambda: scheduler.prune_fires(retention.fire_retention_s))
    audited = step(
        "prune_audit",
        lambda: audit.prune(engine, datetime.now(UTC) - timedelta(seconds=retention.audit_retention_s)),
    )
    refreshed = step("refresh_schedules", scheduler.refresh)
    # Scratch directories of renders whose worker was killed (tasks.outputs).
    partials = step("clean_partials", lambda: clean_partial_outputs(engine, Path(settings.output_root)))
    report = ResyncReport(
        reaped,
        recovered,
        republished,
        pruned.jobs if pruned is not None else None,
        purged,
        fires,
        refreshed,
        tuple(errors),
        partials_removed=partials,
        events_pruned=pruned.events if pruned is not None else None,
        outbox_pruned=pruned.outbox if pruned is not None else None,
        audit_pruned=audited,
    )
    for table, rows in (
        ("jobs", report.jobs_pruned),
        ("job_events", report.events_pruned),
        ("outbox", report.outbox_pruned),
        ("dead_letters", purged),
        ("schedule_fires", fires),
        ("audit_log", audited),
    ):
        record_pruned(table, rows or 0)
    if reaped or recovered or republished or report.jobs_pruned or report.events_pruned or purged or fires or audited:
        logger.info("Resync: %s", report)
    else:
        logger.debug("Resync: %s", report)
    return report


def retention_in_force(engine: Any, config: MaintenanceConfig, settings: Settings | None = None) -> Retention:
    """What this resync keeps: *config*'s explicit values, else the effective runtime settings.

    The effective value of each ``retention.*`` key is its saved value (an admin's, from the next
    resync on), else its ``TENURE_RETENTION_*`` variable, else the default; a saved
    ``retention.finished_jobs_days`` covers the statuses without their own saved key.
    """
    settings = settings or current_settings()
    values = effective_values(engine, settings)
    return Retention(
        jobs=config.retention or effective_policy(engine, settings),
        fire_retention_s=(
            config.fire_retention_s
            if config.fire_retention_s is not None
            else float(values["retention.fires_days"]) * DAY_S
        ),
        dead_letter_retention_ms=(
            config.dead_letter_retention_ms
            if config.dead_letter_retention_ms is not None
            else int(values["retention.dead_letters_days"] * DAY_S * 1000)
        ),
        audit_retention_s=(
            config.audit_retention_s
            if config.audit_retention_s is not None
            else float(values["retention.audit_days"]) * DAY_S
        ),
    )


#: The resync actor's name (the ``maintenance`` queue's only actor).
RESYNC_ACTOR = "resync"


def declare_resync(broker: Broker) -> Any:
    """Declare the resync on *broker*: every 30 s (sub-minute), exactly once per tick across schedulers.

    Declaring ``periodic=`` needs the schedule middleware on the broker first (idempotent).
    """
    install(broker)
    existing = broker.actors.get(RESYNC_ACTOR)
    if existing is not None:
        return existing

    def resync() -> None:
        run_resync(broker)

    # the next tick is the retry; a run that hangs is cut off before the next tick's
    wanted = {"max_retries": 0, "time_limit": 60_000}
    return dramatiq.actor(
        resync,
        actor_name=RESYNC_ACTOR,
        queue_name="maintenance",
        broker=broker,
        **{k: v for k, v in wanted.items() if k in broker.actor_options},
        periodic=every(
            seconds=RESYNC_PERIOD_S,
            catchup="latest",
            grace_s=RESYNC_PERIOD_S,
            max_staleness_s=RESYNC_MAX_STALENESS_S,
        ),
    )
