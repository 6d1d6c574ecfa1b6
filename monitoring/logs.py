"""Structured lifecycle log lines (job started/completed/failed/cancelled…) and the metrics they feed.

Layering: ``jobs`` must not import ``monitoring``. So the job layer emits plain :mod:`logging`
records on the logger ``tenure.lifecycle`` with one ``extra`` key, ``tenure``, holding the event::

    logging.getLogger("tenure.lifecycle").info(
        "job.completed",
        extra={"tenure": {"event": "job.completed", "job_id": job.id, "kind": job.kind,
                          "attempt": job.attempt, "outcome": "succeeded", "duration_s": 1.25}},
    )

and this module turns those records into

- one line per event with only allow-listed fields (:class:`LifecycleFormatter`, key=value or
  JSON) — payloads, results, arguments and anything else passed in ``extra`` are never printed;
- metrics (:class:`LifecycleMetricsHandler`): ``tenure_jobs_finished_total{kind,outcome}``,
  ``tenure_stale_attempts_total``, ``tenure_schedule_fires_total{schedule,result}``.

Layers that may import monitoring (tasks, webapp, the scheduler) call :func:`log_event`, which
counts the event itself (whatever the log level, in any process) before logging it.
:class:`monitoring.middleware.MetricsMiddleware` installs the metrics handler in every worker
process, for the job layer's plain records; other processes call :func:`install` to print the lines.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import Mapping
from typing import Any, TextIO

from jobs.lifecycle import OBSERVED
from jobs.lifecycle import observers as lifecycle_observers

from . import metrics as m

#: The logger lifecycle events are emitted on.
LIFECYCLE_LOGGER = "tenure.lifecycle"
#: The ``extra`` key carrying the event fields.
EXTRA_KEY = "tenure"

#: Events and what they mean. ``job.*`` events carry job_id, kind, attempt; finished ones outcome
#: and duration_s.
EVENTS = {
    "job.started": "an attempt started running",
    "job.completed": "an attempt succeeded (outcome=succeeded)",
    "job.failed": "an attempt failed (outcome=failed; retrying=true when another attempt follows)",
    "job.retrying": "an attempt failed and the job was queued for another attempt (outcome=retrying)",
    "job.cancelled": "the job was cancelled (outcome=cancelled)",
    "job.interrupted": "a lease expired on an unsafe actor; parked for review (outcome=interrupted)",
    "job.stale_write": "a write from a stale attempt was rejected",
    "schedule.fire": "a scheduler handled ticks (schedule, result=fired|duplicate|skipped, ticks=how many)",
}
#: The only fields ever printed, per event family, in this order. Values must be scalars (str, int,
#: float, bool); anything else (a payload, a result dict) is dropped, strings are truncated.
JOB_FIELDS = (
    "event",
    "job_id",
    "kind",
    "attempt",
    "outcome",
    "duration_s",
    "retrying",
    "error_type",
    "queue",
    "worker_id",
)
SCHEDULE_FIELDS = ("event", "schedule", "result", "tick", "ticks")
FIELDS = tuple(dict.fromkeys(JOB_FIELDS + SCHEDULE_FIELDS))
#: Longest value printed.
MAX_VALUE_CHARS = 200

_FINISHED = {"job.completed": "succeeded", "job.failed": "failed", "job.cancelled": "cancelled"}
_FINISHED["job.interrupted"] = "interrupted"


def event_fields(record: logging.LogRecord) -> dict[str, Any] | None:
    """The allow-listed fields of a lifecycle record, or ``None`` for other records."""
    raw = getattr(record, EXTRA_KEY, None)
    if not isinstance(raw, Mapping) or "event" not in raw:
        return None
    return _allowed(raw)


def _allowed(raw: Mapping[str, Any]) -> dict[str, Any]:
    allowed = SCHEDULE_FIELDS if str(raw["event"]).startswith("schedule.") else JOB_FIELDS
    out: dict[str, Any] = {}
    for key in allowed:
        value = _scalar(raw.get(key))
        if value is not None:
            out[key] = value
    return out


def _scalar(value: Any) -> Any:
    """The printable form of an allowed value; ``None`` for anything that is not a scalar."""
    if isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, str):
        return value.replace("\n", " ").replace("\r", " ")[:MAX_VALUE_CHARS]
    return None


class LifecycleFormatter(logging.Formatter):
    """Formats lifecycle records as ``key=value`` (default) or one JSON object per line.

    Records without lifecycle fields are formatted by the standard formatter.
    """

    def __init__(self, *, as_json: bool = False) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields = event_fields(record)
        if fields is None:
            return super().format(record)
        if self.as_json:
            return json.dumps(
                {"ts": round(record.created, 3), "level": record.levelname, "logger": record.name, **fields},
                separators=(",", ":"),
            )
        return f"{self.formatTime(record)} {record.levelname} {record.name} {_pairs(fields)}"


def _pairs(fields: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={_quote(v)}" for k, v in fields.items())


def _quote(value: Any) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return json.dumps(text) if (not text or any(c in text for c in ' ="')) else text


class LifecycleMetricsHandler(logging.Handler):
    """Counts lifecycle events into :mod:`monitoring.metrics` (prints nothing)."""

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, OBSERVED, False):
            return  # counted by observe_lifecycle already
        fields = event_fields(record)
        if fields is None:
            return
        try:
            count(fields)
        except Exception:
            self.handleError(record)


def count(fields: Mapping[str, Any]) -> None:
    """Count one lifecycle event into its metrics."""
    event = fields["event"]
    if event in _FINISHED:
        m.JOBS_FINISHED.labels(str(fields.get("kind", "")), _FINISHED[event]).inc()
    elif event == "job.stale_write":
        m.record_stale_attempt()
    elif event == "schedule.fire" and fields.get("result") in m.SCHEDULE_RESULTS:
        ticks = fields.get("ticks", 1)
        if type(ticks) is int and ticks > 0:  # not a bool, not a float: a count of ticks
            m.record_schedule_fire(str(fields.get("schedule", "")), str(fields["result"]), ticks)


def observe_lifecycle(fields: dict[str, Any]) -> None:
    """The job layer's lifecycle observer: counts events whatever the log level (job.completed is DEBUG)."""
    count(fields)


def log_event(event: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """Count one lifecycle event into its metrics, then log it (for layers allowed to import monitoring).

    Counting does not depend on the log level or on a handler being installed: the scheduler's
    ``periodiq`` process, for one, never boots :class:`~monitoring.middleware.MetricsMiddleware`. The
    record is marked as counted, so :class:`LifecycleMetricsHandler` does not count it again; its
    message is the allow-listed ``key=value`` pairs, readable through any formatter.

    Parameters:
      event: One of :data:`EVENTS`.
      level: The record's level.
      fields: Any of :data:`FIELDS`; others are neither printed nor counted.
    """
    data = _allowed({"event": event, **fields})
    count(data)
    logger = logging.getLogger(LIFECYCLE_LOGGER)
    if logger.isEnabledFor(level):
        logger.log(level, "%s", _pairs(data), extra={EXTRA_KEY: data, OBSERVED: True})


def install_metrics_handler(logger_name: str = LIFECYCLE_LOGGER) -> LifecycleMetricsHandler:
    """Attach the metrics handler to the lifecycle logger once per process; the handler."""
    logger = logging.getLogger(logger_name)
    for h in logger.handlers:
        if isinstance(h, LifecycleMetricsHandler):
            return h
    handler = LifecycleMetricsHandler()
    logger.addHandler(handler)
    if observe_lifecycle not in lifecycle_observers:
        lifecycle_observers.append(observe_lifecycle)
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    return handler


def install(*, as_json: bool = False, stream: TextIO | None = None, logger_name: str = LIFECYCLE_LOGGER) -> None:
    """Print lifecycle lines to *stream* (default stderr) and count them into metrics. Idempotent.

    The lifecycle logger stops propagating, so the root handler does not print the bare event name a
    second time.
    """
    logger = logging.getLogger(logger_name)
    install_metrics_handler(logger_name)
    if not any(isinstance(h.formatter, LifecycleFormatter) for h in logger.handlers):
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(LifecycleFormatter(as_json=as_json))
        logger.addHandler(handler)
    logger.propagate = False
