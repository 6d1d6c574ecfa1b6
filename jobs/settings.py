"""Tenure's configuration: one frozen :class:`Settings`, read from ``TENURE_*`` variables once.

Nothing here reads the environment at import time; processes call :meth:`Settings.from_env` at
start and pass the result down. Jobs keep the :meth:`Settings.job_snapshot` taken at submit.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Where the database lives when ``TENURE_DATABASE_URL`` is unset.
DEFAULT_DATABASE_URL = "sqlite:///var/tenure.db"
#: How long a running job stays owned by its worker without a heartbeat, in seconds.
DEFAULT_JOB_LEASE_TTL_S = 30.0
#: Shortest job lease accepted, in seconds (heartbeats run at a third of it).
MIN_JOB_LEASE_TTL_S = 0.3
#: How long a broker message lease lasts without a heartbeat, in seconds.
DEFAULT_BROKER_LEASE_TTL_S = 30.0
#: Default wall-clock limit of one attempt, in seconds.
DEFAULT_JOB_TIMEOUT_S = 900
#: Default number of attempts (the first run included).
DEFAULT_MAX_ATTEMPTS = 3
#: Where ``JobContext.output_path`` puts files.
DEFAULT_OUTPUT_ROOT = "var/outputs"
#: How often an idle relay polls the outbox, in seconds.
DEFAULT_RELAY_INTERVAL_S = 0.2
#: How long a SQLite connection waits for the write lock, in milliseconds.
DEFAULT_SQLITE_BUSY_TIMEOUT_MS = 30_000


class SettingsError(ValueError):
    """A ``TENURE_*`` variable has a value Tenure cannot use."""


def _float(env: Mapping[str, str], name: str, default: float, *, minimum: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise SettingsError(f"{name}={raw!r} must be at least {minimum}")
    return value


def _int(env: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise SettingsError(f"{name}={raw!r} must be at least {minimum}")
    return value


def _scheme(url: str) -> str:
    return url.split(":", 1)[0].split("+", 1)[0].lower()


@dataclass(frozen=True)
class Settings:
    """Validated configuration of one Tenure process.

    Attributes:
      database_url: Job records (``sqlite:///…`` or ``postgresql://…``).
      broker_url: Messages (``sqlite:///…``, ``redis://…``, ``amqp://…``); defaults to the database
        URL when that is SQLite, so a job and its message share one transaction.
      job_lease_ttl_s: A running job's lease; a worker renews it every third of it.
      broker_lease_ttl_s: The SQLite broker's message lease.
      job_timeout_s: Default per-attempt time limit of new jobs.
      max_attempts: Default attempts of new jobs.
      output_root: Root of per-attempt output files (snapshotted into each job's config).
      recovery_interval_s: How often a worker recovers expired jobs (default: the job lease TTL).
      relay_interval_s: How often an idle outbox relay polls.
      sqlite_busy_timeout_ms: SQLite write-lock wait.
    """

    database_url: str = DEFAULT_DATABASE_URL
    broker_url: str = DEFAULT_DATABASE_URL
    job_lease_ttl_s: float = DEFAULT_JOB_LEASE_TTL_S
    broker_lease_ttl_s: float = DEFAULT_BROKER_LEASE_TTL_S
    job_timeout_s: int = DEFAULT_JOB_TIMEOUT_S
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    output_root: str = DEFAULT_OUTPUT_ROOT
    recovery_interval_s: float = DEFAULT_JOB_LEASE_TTL_S
    relay_interval_s: float = DEFAULT_RELAY_INTERVAL_S
    sqlite_busy_timeout_ms: int = DEFAULT_SQLITE_BUSY_TIMEOUT_MS
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read and validate the ``TENURE_*`` variables.

        Parameters:
          env: The variables to read (default: ``os.environ``, read now, not at import).

        Raises:
          SettingsError: A value is malformed or the combination cannot work.

        Returns:
          The frozen settings.
        """
        env = os.environ if env is None else env
        database_url = (env.get("TENURE_DATABASE_URL") or DEFAULT_DATABASE_URL).strip()
        if _scheme(database_url) not in ("sqlite", "postgresql", "postgres"):
            raise SettingsError(
                f"TENURE_DATABASE_URL={database_url!r}: use sqlite:///path.db or postgresql://user@host/db"
            )
        broker_url = (env.get("TENURE_BROKER_URL") or "").strip()
        if not broker_url:
            if _scheme(database_url) != "sqlite":
                raise SettingsError(
                    "TENURE_BROKER_URL is required when TENURE_DATABASE_URL is not SQLite "
                    "(redis://… or amqp://…; the SQLite broker needs the SQLite database)"
                )
            broker_url = database_url
        if _scheme(broker_url) not in ("sqlite", "redis", "rediss", "amqp", "amqps"):
            raise SettingsError(f"TENURE_BROKER_URL={broker_url!r}: use sqlite:///…, redis://… or amqp://…")
        lease = _float(env, "TENURE_JOB_LEASE_TTL_S", DEFAULT_JOB_LEASE_TTL_S, minimum=MIN_JOB_LEASE_TTL_S)
        return cls(
            database_url=database_url,
            broker_url=broker_url,
            job_lease_ttl_s=lease,
            broker_lease_ttl_s=_float(env, "TENURE_BROKER_LEASE_TTL_S", DEFAULT_BROKER_LEASE_TTL_S, minimum=1.0),
            job_timeout_s=_int(env, "TENURE_JOB_TIMEOUT_S", DEFAULT_JOB_TIMEOUT_S, minimum=1),
            max_attempts=_int(env, "TENURE_JOB_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS, minimum=1),
            output_root=(env.get("TENURE_OUTPUT_ROOT") or DEFAULT_OUTPUT_ROOT).strip(),
            recovery_interval_s=_float(env, "TENURE_RECOVERY_INTERVAL_S", lease, minimum=0.1),
            relay_interval_s=_float(env, "TENURE_RELAY_INTERVAL_S", DEFAULT_RELAY_INTERVAL_S, minimum=0.01),
            sqlite_busy_timeout_ms=_int(
                env, "TENURE_SQLITE_BUSY_TIMEOUT_MS", DEFAULT_SQLITE_BUSY_TIMEOUT_MS, minimum=100
            ),
        )

    @property
    def database_is_sqlite(self) -> bool:
        return _scheme(self.database_url) == "sqlite"

    def job_snapshot(self) -> dict[str, Any]:
        """The settings a job keeps from its submit time (no URLs: they may carry credentials)."""
        return {"output_root": self.output_root, **dict(self.extra)}


_current: Settings | None = None


def current_settings() -> Settings:
    """This process's settings, read from the environment on first use (never at import)."""
    global _current
    if _current is None:
        _current = Settings.from_env()
    return _current


def set_current_settings(settings: Settings | None) -> None:
    """Replace this process's settings (composition roots and tests)."""
    global _current
    _current = settings
