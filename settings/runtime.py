"""Runtime settings: what an admin may change without a deploy, saved as one revision per batch.

The catalogue (:data:`CATALOGUE`) declares every key with its type, default, validation, when a change
takes effect (``effect``) and whether it is a secret. Two families are patterns, one key per name:
``queues.<name>.paused`` and ``schedules.<name>.paused``.

Layering of :func:`get_settings`'s ``effective`` values: catalogue default ← the process's env
:class:`~settings.environment.Settings` (keys that have a ``TENURE_*`` counterpart) ← the latest saved batch.
Keys whose effect is ``restart`` are the exception: ``effective`` shows what this process started with,
and the key is listed in ``pending_restart`` while the saved value differs from it.

:func:`put_settings` replaces the saved batch as a whole: ``values`` is the complete set of saved keys
(an omitted key falls back to its env/default value), except secrets, which are write-only: an omitted
secret keeps its saved value, ``null`` clears it, and no response or log line ever carries its value
(only ``{"set": true|false}``). Everything is validated before anything is written (a failed save
publishes nothing); a stale ``expected_revision`` raises :class:`SettingsConflict`.

Deployment settings (database and broker URLs, authentication) are shown read-only and can never be
saved here: they are ``TENURE_*`` variables read at start.

Applying a change to other components (pausing a queue on the broker, pausing a schedule) is the
caller's job: :func:`changed_effective` says which keys' effective values a save changed. Components
that read a key when they need it use :func:`effective_values`: the resync reads the retention keys
on every run (:func:`jobs.retention.effective_policy`), the webhook notifier reads
``notify.webhook_secret`` on every delivery attempt (``tasks/channels.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from . import runtime_store as store
from .environment import (
    DEFAULT_FAIR_SHARE_WINDOW,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETENTION_AUDIT_DAYS,
    DEFAULT_RETENTION_DAYS,
    DEFAULT_RETENTION_DEAD_LETTERS_DAYS,
    DEFAULT_RETENTION_EVENTS_DAYS,
    DEFAULT_RETENTION_FIRES_DAYS,
    MAX_RETENTION_DAYS,
)

logger = logging.getLogger(__name__)

#: One encoder for every saved document: canonical JSON (sorted keys, no spaces).
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def now_ms() -> int:
    return int(time.time() * 1000)


def _read(engine: Engine) -> Connection:
    # Read-only: on the job layer's SQLite engines (jobs.db.make_engine) a deferred BEGIN, never the write lock.
    return engine.connect().execution_options(tenure_readonly=True)


#: When a change takes effect. AT_ONCE: applied by the process that saves it, before the save answers.
AT_ONCE = "at once"
NEXT_JOB = "next job"
NEXT_BOUNDARY = "next boundary"
RESTART = "restart"

#: Names inside pattern keys (queue and schedule names).
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,99}$")
#: Keys of settings that are deployment-only (never writable here).
DEPLOYMENT_KEYS = frozenset({"database_url", "broker_url", "auth", "secret_key"})


class SettingsInvalid(ValueError):
    """One or more values do not validate; nothing was saved.

    Attributes:
      errors: key → reason (never the rejected value: it may be a secret).
    """

    def __init__(self, errors: Mapping[str, str]) -> None:
        super().__init__("Runtime settings did not validate: " + ", ".join(sorted(errors)))
        self.errors = dict(errors)


class SettingsConflict(Exception):
    """``expected_revision`` is not the latest revision (someone saved in between)."""

    def __init__(self, expected: int, current: int) -> None:
        super().__init__(f"Runtime settings are at revision {current}, not {expected}; reload and save again.")
        self.expected = expected
        self.current = current


@dataclass(frozen=True)
class SettingSpec:
    """One declared runtime setting.

    Attributes:
      key: The key, or a pattern with ``<name>`` (``queues.<name>.paused``).
      type: ``bool``, ``int`` or ``str``.
      default: Value when neither the environment nor a save sets it (None: the component's own default).
      effect: :data:`AT_ONCE`, :data:`NEXT_JOB`, :data:`NEXT_BOUNDARY` or :data:`RESTART`.
      help: One line for the UI and docs.
      secret: Write-only: shown as ``{"set": bool}``.
      nullable: ``null`` is a valid saved value.
      minimum / maximum: Bounds of an ``int``; maximum length of a ``str``.
      env: Reads the key's ``TENURE_*`` counterpart from a Settings object (None: no counterpart).
      fallback: A broader saved key used when this one is not saved (``retention.finished_jobs_days``
        for the per-status retention keys); it beats the environment, as any saved value does.
      format_re: A ``str`` must match this whole (also the JSON Schema's ``pattern``, so the
        OpenAPI document accepts exactly what :func:`validate` does); ``format_help`` says why not.
    """

    key: str
    type: str
    default: Any
    effect: str
    help: str
    secret: bool = False
    nullable: bool = False
    minimum: int | None = None
    maximum: int | None = None
    env: Callable[[Any], Any] | None = None
    fallback: str | None = None
    format_re: str | None = None
    format_help: str = ""

    @property
    def pattern(self) -> bool:
        return "<name>" in self.key

    def public(self) -> dict[str, Any]:
        """The catalogue entry as JSON (no callables)."""
        return {
            "key": self.key,
            "type": self.type,
            "default": None if self.secret else self.default,
            "effect": self.effect,
            "help": self.help,
            "secret": self.secret,
            "nullable": self.nullable,
            "minimum": self.minimum,
            "maximum": self.maximum,
        }


_B64 = "[A-Za-z0-9+/]"
#: A Standard Webhooks secret: ``whsec_`` (optional, as receivers strip it) and canonical base64 of
#: 24 to 64 bytes (the spec's range). Receivers decode the secret to the HMAC key; a value outside
#: this could not be verified by them, so it is refused when saved rather than at the next delivery.
WEBHOOK_SECRET_RE = (
    rf"^(?:whsec_)?(?:(?:{_B64}{{4}}){{8,20}}(?:{_B64}{{2}}==|{_B64}{{3}}=)?|(?:{_B64}{{4}}){{21}}(?:{_B64}{{2}}==)?)$"
)

CATALOGUE: tuple[SettingSpec, ...] = (
    SettingSpec(
        "queues.<name>.paused",
        "bool",
        False,
        AT_ONCE,
        "Pause claims on the queue: applied on the broker when saved; workers stop at their next claim.",
    ),
    SettingSpec(
        "schedules.<name>.paused",
        "bool",
        False,
        AT_ONCE,
        "Pause the schedule: applied when saved; no scheduler fires it from its next tick.",
    ),
    SettingSpec(
        "retention.finished_jobs_days",
        "int",
        None,
        NEXT_BOUNDARY,
        "Keep finished jobs of every status this many days, unless the status has its own saved key "
        "(null: the per-status values); read by the next resync.",
        nullable=True,
        minimum=1,
        maximum=MAX_RETENTION_DAYS,
    ),
    *(
        SettingSpec(
            f"retention.{status}_jobs_days",
            "int",
            DEFAULT_RETENTION_DAYS[status],
            NEXT_BOUNDARY,
            f"Keep {status} jobs (with their workflow steps, events and idempotency keys) this many days "
            f"after they finished (TENURE_RETENTION_{status.upper()}_DAYS); read by the next resync.",
            nullable=True,
            minimum=1,
            maximum=MAX_RETENTION_DAYS,
            env=lambda s, status=status: getattr(s, f"retention_{status}_days", None),
            fallback="retention.finished_jobs_days",
        )
        for status in DEFAULT_RETENTION_DAYS
    ),
    SettingSpec(
        "retention.events_days",
        "int",
        DEFAULT_RETENTION_EVENTS_DAYS,
        NEXT_BOUNDARY,
        "Keep the events of a finished job this many days after it finished (its last event stays "
        "while the job is kept; TENURE_RETENTION_EVENTS_DAYS); read by the next resync.",
        nullable=True,
        minimum=1,
        maximum=MAX_RETENTION_DAYS,
        env=lambda s: getattr(s, "retention_events_days", None),
    ),
    SettingSpec(
        "retention.dead_letters_days",
        "int",
        DEFAULT_RETENTION_DEAD_LETTERS_DAYS,
        NEXT_BOUNDARY,
        "Keep dead letters this many days (SQLite broker; TENURE_RETENTION_DEAD_LETTERS_DAYS); "
        "read by the next resync.",
        minimum=1,
        maximum=MAX_RETENTION_DAYS,
        env=lambda s: getattr(s, "retention_dead_letters_days", None),
    ),
    SettingSpec(
        "retention.fires_days",
        "int",
        DEFAULT_RETENTION_FIRES_DAYS,
        NEXT_BOUNDARY,
        "Keep schedule fire rows this many days (each schedule's latest is kept; "
        "TENURE_RETENTION_FIRES_DAYS); read by the next resync.",
        minimum=1,
        maximum=MAX_RETENTION_DAYS,
        env=lambda s: getattr(s, "retention_fires_days", None),
    ),
    SettingSpec(
        "retention.audit_days",
        "int",
        DEFAULT_RETENTION_AUDIT_DAYS,
        NEXT_BOUNDARY,
        "Keep audit log rows this many days (TENURE_RETENTION_AUDIT_DAYS); read by the next resync.",
        minimum=1,
        maximum=MAX_RETENTION_DAYS,
        env=lambda s: getattr(s, "retention_audit_days", None),
    ),
    SettingSpec(
        "jobs.default_max_attempts",
        "int",
        DEFAULT_MAX_ATTEMPTS,
        RESTART,
        "Default attempts of new jobs (TENURE_JOB_MAX_ATTEMPTS); the web process reads the saved value at start.",
        minimum=1,
        maximum=100,
        env=lambda s: getattr(s, "max_attempts", None),
    ),
    SettingSpec(
        "fair_share.enabled",
        "bool",
        True,
        NEXT_BOUNDARY,
        "Start the ready jobs of a queue in rotation across owners (weighted by owners.<name>.weight); "
        "every worker and web process reads it within 2 s.",
    ),
    SettingSpec(
        "fair_share.window",
        "int",
        DEFAULT_FAIR_SHARE_WINDOW,
        NEXT_BOUNDARY,
        "With fair share on, how many jobs of one queue wait in the broker ready to start; the others wait in "
        "the job store and are admitted in rotation across owners. Keep it above the queue's worker threads.",
        minimum=1,
        maximum=100_000,
    ),
    SettingSpec(
        "owners.<name>.weight",
        "int",
        1,
        NEXT_BOUNDARY,
        "The owner's share under fair share, relative to the others' (default 1: equal shares).",
        minimum=1,
        maximum=1000,
    ),
    SettingSpec(
        "concurrency.<name>.limit",
        "int",
        None,
        NEXT_BOUNDARY,
        "At most this many jobs of one key of the concurrency limit run at once, on every host "
        "(null: the kind's declared limit).",
        nullable=True,
        minimum=1,
        maximum=100_000,
    ),
    SettingSpec(
        "rate.<name>.starts",
        "int",
        None,
        NEXT_BOUNDARY,
        "At most this many jobs of one key of the rate limit start per period (null: the kind's declared rate).",
        nullable=True,
        minimum=1,
        maximum=1_000_000,
    ),
    SettingSpec(
        "rate.<name>.period_s",
        "int",
        None,
        NEXT_BOUNDARY,
        "The rate limit's period in seconds (null: the kind's declared period).",
        nullable=True,
        minimum=1,
        maximum=86_400,
    ),
    SettingSpec(
        "notify.webhook_secret",
        "str",
        None,
        NEXT_BOUNDARY,
        "Standard Webhooks secret (whsec_…) signing every webhook channel from its next delivery attempt, "
        "in place of the channels file's secrets (null: the file's); write-only.",
        secret=True,
        nullable=True,
        minimum=None,
        maximum=512,
        format_re=WEBHOOK_SECRET_RE,
        format_help="must be a Standard Webhooks secret: whsec_ and the base64 of 24 to 64 random bytes",
    ),
)


_BY_KEY = {spec.key: spec for spec in CATALOGUE if not spec.pattern}
#: Pattern keys by family (the key's first part); a family may have several (``rate.<name>.starts``, ``….period_s``).
_PATTERNS: dict[str, list[SettingSpec]] = {}
for _spec in CATALOGUE:
    if _spec.pattern:
        _PATTERNS.setdefault(_spec.key.split(".", 1)[0], []).append(_spec)


def values_json_schema() -> dict[str, Any]:
    """JSON Schema of a ``values`` batch, derived from :data:`CATALOGUE` (for the OpenAPI document):
    exactly what :func:`validate` accepts when any well-formed queue/schedule name is allowed."""

    def value_schema(spec: SettingSpec) -> dict[str, Any]:
        schema: dict[str, Any]
        if spec.type == "bool":
            schema = {"type": "boolean"}
        elif spec.type == "int":
            schema = {"type": "integer"}
            if spec.minimum is not None:
                schema["minimum"] = spec.minimum
            if spec.maximum is not None:
                schema["maximum"] = spec.maximum
        else:
            schema = {"type": "string", "minLength": 1}
            if spec.maximum is not None:
                schema["maxLength"] = spec.maximum
            if spec.format_re is not None:
                schema["pattern"] = spec.format_re
        if spec.nullable:
            schema["type"] = [schema["type"], "null"]
        return schema

    name = NAME_RE.pattern.removeprefix("^").removesuffix("$")
    patterns = {}
    for spec in CATALOGUE:
        if spec.pattern:
            before, after = spec.key.split("<name>", 1)
            patterns["^" + re.escape(before) + name + re.escape(after) + "$"] = value_schema(spec)
    return {
        "type": "object",
        "properties": {spec.key: value_schema(spec) for spec in CATALOGUE if not spec.pattern},
        "patternProperties": patterns,
        "additionalProperties": False,
        "description": "every saved key; omitted secrets keep their value, null clears",
    }


def spec_for(key: str) -> tuple[SettingSpec, str | None] | None:
    """The spec of *key* and, for a pattern key, its name (None when the key is not declared)."""
    if key in _BY_KEY:
        return _BY_KEY[key], None
    family, _, rest = key.partition(".")
    for spec in _PATTERNS.get(family, ()):
        suffix = spec.key.split("<name>", 1)[1]  # ".paused"
        if rest.endswith(suffix):
            name = rest[: -len(suffix)]
            return (spec, name) if NAME_RE.match(name) else None
    return None


def _check(spec: SettingSpec, value: Any) -> str | None:
    """The reason *value* is invalid for *spec* (None: valid). Never includes the value."""
    if value is None:
        return None if spec.nullable else "must not be null"
    if spec.type == "bool":
        return None if isinstance(value, bool) else "must be true or false"
    if spec.type == "int":
        if isinstance(value, bool) or not (isinstance(value, int) or isinstance(value, float) and value.is_integer()):
            return "must be an integer"  # JSON's 97.0 is an integer too (JSON Schema says so)
        if spec.minimum is not None and value < spec.minimum:
            return f"must be at least {spec.minimum}"
        if spec.maximum is not None and value > spec.maximum:
            return f"must be at most {spec.maximum}"
        return None
    if spec.type == "str":
        if not isinstance(value, str):
            return "must be a string"
        if not value:
            return "must not be empty (use null to clear)"
        if spec.maximum is not None and len(value) > spec.maximum:
            return f"must be at most {spec.maximum} characters"
        if spec.format_re is not None and not re.fullmatch(spec.format_re, value):
            return spec.format_help or "is not in the expected format"
        return None
    return "has an unknown type"  # pragma: no cover - catalogue error


def validate(
    values: Any,
    *,
    queues: Collection[str] | None = None,
    schedules: Collection[str] | None = None,
) -> dict[str, Any]:
    """Check a batch; return it as a plain dict.

    Parameters:
      values: key → value (a JSON object).
      queues / schedules: Names that exist (None: any well-formed name is accepted).

    Raises:
      SettingsInvalid: Every reason at once (key → reason); nothing is saved by the caller.
    """
    if not isinstance(values, Mapping):
        raise SettingsInvalid({"values": "must be an object of key → value"})
    errors: dict[str, str] = {}
    known = {"queues": queues, "schedules": schedules}
    for key, value in values.items():
        if not isinstance(key, str) or len(key) > 300:
            errors[str(key)[:300]] = "is not a runtime setting"
            continue
        if key in DEPLOYMENT_KEYS or key.startswith("deployment."):
            errors[key] = "is a deployment setting: read-only here (set its TENURE_* variable and restart)"
            continue
        found = spec_for(key)
        if found is None:
            errors[key] = "is not a runtime setting"
            continue
        spec, name = found
        names = known.get(key.split(".", 1)[0]) if name is not None else None
        if names is not None and name not in names:
            errors[key] = f"names no known {key.split('.', 1)[0][:-1]}"
            continue
        reason = _check(spec, value)
        if reason:
            errors[key] = reason
    if errors:
        raise SettingsInvalid(errors)
    return {k: int(v) if isinstance(v, float) else v for k, v in values.items()}


def _mask(spec: SettingSpec, value: Any) -> Any:
    return {"set": value is not None} if spec.secret else value


def _masked(values: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        found = spec_for(key)
        out[key] = _mask(found[0], value) if found else value
    return out


def _load(document: str | None) -> dict[str, Any]:
    if not document:
        return {}
    value = json.loads(document)
    return value if isinstance(value, dict) else {}


def saved_values(engine: Engine) -> dict[str, Any]:
    """The latest saved batch, unmasked (for components of this deployment: never for responses)."""
    with _read(engine) as conn:
        row = store.latest(conn)
    return _load(row.document if row else None)


def saved_on(conn: Any) -> dict[str, Any]:
    """:func:`saved_values` read on the caller's connection, inside its transaction (SQLAlchemy or DB-API)."""
    return _load(store.latest_document(conn))


def _effective(saved: Mapping[str, Any], settings: Any) -> tuple[dict[str, Any], list[str]]:
    """(effective values, keys pending a restart), secrets unmasked.

    A saved ``null`` means "not saved": the value falls back to the key's ``fallback`` key if that
    is saved, then to the environment's value, then to the default.
    """
    effective: dict[str, Any] = {}
    pending: list[str] = []
    for spec in CATALOGUE:
        if spec.pattern:
            continue
        running = spec.default
        if spec.env is not None and settings is not None:
            env_value = spec.env(settings)
            if env_value is not None:
                running = env_value
        if spec.effect == RESTART:
            effective[spec.key] = saved.get(spec.key, running) if spec.env is None else running
            if spec.env is not None and spec.key in saved and saved[spec.key] != running:
                pending.append(spec.key)
            continue
        value = saved.get(spec.key)
        if value is None and spec.fallback is not None:
            value = saved.get(spec.fallback)
        effective[spec.key] = running if value is None else value
    for key, value in saved.items():
        found = spec_for(key)
        if found is not None and found[1] is not None:
            effective[key] = value
    return effective, pending


def effective_values(engine: Engine, settings: Any = None) -> dict[str, Any]:
    """The effective value of every declared key, secrets unmasked (for this deployment's components
    such as the resync and the notifiers: never for responses or logs).

    Parameters:
      engine: The job database.
      settings: This process's Settings (the environment layer; None: defaults only).
    """
    return _effective(saved_values(engine), settings)[0]


def _deployment(settings: Any) -> dict[str, Any]:
    def redact(url: Any) -> Any:
        if not isinstance(url, str):
            return None
        try:
            return make_url(url).render_as_string(hide_password=True)
        except Exception:  # an unparsable URL: show only its scheme
            return url.split(":", 1)[0] + ":…"

    return {
        "database_url": redact(getattr(settings, "database_url", None)),
        "broker_url": redact(getattr(settings, "broker_url", None)),
        "auth": "users and API tokens in the database; TENURE_SECRET_KEY signs sessions",
    }


def _view(row: store.RevisionRow | None, settings: Any, older_snapshots: Callable[[int], int] | None) -> dict[str, Any]:
    saved = _load(row.document if row else None)
    effective, pending = _effective(saved, settings)
    older = older_snapshots(row.saved_at) if row and older_snapshots is not None else 0
    return {
        "revision": row.revision if row else 0,
        "saved_at": datetime.fromtimestamp(row.saved_at / 1000, UTC) if row else None,
        "saved_by": row.saved_by if row else None,
        "saved": _masked(saved),
        "effective": _masked(effective),
        "pending_restart": pending,
        "jobs_on_older_snapshot": older,
        "catalogue": [spec.public() for spec in CATALOGUE],
        "deployment": _deployment(settings),
    }


def get_settings(
    engine: Engine, settings: Any = None, *, older_snapshots: Callable[[int], int] | None = None
) -> dict[str, Any]:
    """The saved and effective runtime settings (secrets masked).

    Parameters:
      engine: The database holding the ``runtime_settings`` table.
      settings: This process's Settings (the env layer and the values it started with).
      older_snapshots: ``f(saved_at_ms) -> n``: how many running jobs were submitted before the latest
        save (the job layer's :func:`jobs.queries.running_jobs_submitted_before`); 0 without it.

    Returns:
      ``{revision, saved_at, saved_by, saved, effective, pending_restart, jobs_on_older_snapshot,
      catalogue, deployment}``. ``jobs_on_older_snapshot`` counts running jobs submitted before the
      latest save (a job's config snapshot does not record a settings revision).
    """
    with _read(engine) as conn:
        row = store.latest(conn)
    return _view(row, settings, older_snapshots)


def changed_effective(before: Mapping[str, Any], after: Mapping[str, Any], settings: Any = None) -> dict[str, Any]:
    """Keys whose effective value differs between two saved batches → the new effective value (unmasked)."""
    old, _ = _effective(before, settings)
    new, _ = _effective(after, settings)
    changed = {}
    for key in set(old) | set(new):
        found = spec_for(key)
        default = found[0].default if found else None
        if old.get(key, default) != new.get(key, default):
            changed[key] = new.get(key, default)
    return changed


def _merge_secrets(before: Mapping[str, Any], batch: Mapping[str, Any]) -> dict[str, Any]:
    """The document to save: *batch*, with omitted secrets kept from *before* and ``null`` secrets dropped."""
    document = dict(batch)
    for spec in CATALOGUE:
        if not spec.secret:
            continue
        if spec.key not in batch:
            if before.get(spec.key) is not None:
                document[spec.key] = before[spec.key]  # omitted secret: keep it
        elif batch[spec.key] is None:
            del document[spec.key]  # null: clear it
    return document


@contextlib.contextmanager
def _writing(engine: Engine, connection: Connection | None) -> Iterator[Connection]:
    """A transaction of its own, or a savepoint inside the caller's open one on *connection*."""
    if connection is None:
        with engine.begin() as conn:
            yield conn
        return
    with connection.begin_nested():
        yield connection


def put_settings(
    engine: Engine,
    values: Any,
    expected_revision: int,
    by: str,
    *,
    settings: Any = None,
    queues: Collection[str] | None = None,
    schedules: Collection[str] | None = None,
    older_snapshots: Callable[[int], int] | None = None,
    connection: Connection | None = None,
) -> dict[str, Any]:
    """Save a new batch as revision ``expected_revision + 1``.

    Parameters:
      engine: The job database.
      connection: A connection to it inside the caller's open transaction: the revision is written
        there (under a savepoint) and commits with the caller's own rows (an audit record); None: a
        transaction of its own.
      values: The complete batch (key → value); omitted secrets keep their saved value, ``null`` clears.
      expected_revision: The revision the caller read (0 before the first save).
      by: The admin's owner id.
      settings: This process's Settings (for ``effective``/``pending_restart``).
      queues / schedules: Existing names (None: any well-formed name).
      older_snapshots: As for :func:`get_settings`.

    Raises:
      SettingsInvalid: Nothing was saved.
      SettingsConflict: ``expected_revision`` is stale; nothing was saved.

    Returns:
      :func:`get_settings`'s view of the new revision, plus ``changed``: the keys whose effective
      value this save changed (secrets masked) — the caller applies queue/schedule keys.
    """
    if isinstance(expected_revision, bool) or not isinstance(expected_revision, int) or expected_revision < 0:
        raise SettingsInvalid({"expected_revision": "must be a non-negative integer"})
    batch = validate(values, queues=queues, schedules=schedules)
    try:
        with _writing(engine, connection) as conn:
            row = store.latest(conn)
            current = row.revision if row else 0
            if current != expected_revision:
                raise SettingsConflict(expected_revision, current)
            before = _load(row.document if row else None)
            document = _merge_secrets(before, batch)
            saved_at = now_ms()
            store.insert_revision(conn, current + 1, saved_at, by, dumps(document))
            new_row = store.RevisionRow(current + 1, saved_at, by, dumps(document))
    except IntegrityError:
        # Another save inserted the same revision first (databases with row locks get here).
        with _read(engine) as conn:
            raise SettingsConflict(expected_revision, store.latest_revision(conn)) from None
    view = _view(new_row, settings, older_snapshots)
    changed = changed_effective(before, document, settings)
    view["changed"] = _masked(changed)
    logger.info(
        "Runtime settings revision %d saved by %s; changed: %s", current + 1, by, ", ".join(sorted(changed)) or "-"
    )
    return view


def overlay_settings(engine: Engine, settings: Any) -> Any:
    """*settings* with the saved restart keys applied (a process calls this once at start).

    Only :class:`~settings.environment.Settings` dataclasses are changed; anything else is returned as is.
    """
    if not dataclasses.is_dataclass(settings) or isinstance(settings, type):
        return settings
    saved = saved_values(engine)
    attempts = saved.get("jobs.default_max_attempts")
    if isinstance(attempts, int) and not isinstance(attempts, bool) and hasattr(settings, "max_attempts"):
        return dataclasses.replace(settings, max_attempts=attempts)
    return settings
