"""Dead letters for operators (SQLite broker): a redacted preview of each, replay by id, and replay or
purge of every letter matching a filter, with the same dry run as the bulk job actions.

The preview shows what identifies a message and why it died, never what it carries: actor, queue,
message id, the job id or schedule it belongs to, its timestamps and retries, the error's last line,
and a truncated view of the arguments in which every string goes through :func:`jobs.errors.redact`
(credentials in URLs, ``key=value`` pairs naming a secret, bearer tokens, long opaque strings), values
of keyword arguments whose name says secret are masked whole, and containers show only their shape.
Other message options (tracebacks, pipes, callbacks) are never shown. A job's payload stays in the
job record, behind the job's own permissions.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from dramatiq.common import q_name

from broker import DeadMatch
from jobs.errors import redact

from .errors import Invalid, NotFound
from .operations import from_ms, joined, known_queues, require_operation

if TYPE_CHECKING:
    from .audit_log import Audited

#: Longest argument text shown in a preview.
MAX_ARG_CHARS = 80
#: Arguments and keyword arguments shown per message.
MAX_ARGS = 8
#: Longest error text shown.
MAX_ERROR_CHARS = 300
#: Most dead letters one bulk replay or purge takes (the rest wait for another run).
MAX_BULK = 10_000
#: Message options carrying identifiers the preview shows (job layer and scheduler).
JOB_ID_OPTION = "tenure_job_id"
SCHEDULE_OPTION = "tenure_schedule"
BULK_ACTIONS = ("replay", "purge")
_UNDECODED: dict[str, Any] = {
    "decoded": False,
    "args": [],
    "kwargs": {},
    "error": None,
    "job_id": None,
    "schedule": None,
    "enqueued_at": None,
    "retries": None,
}


def dead_letters(
    broker: Any, queue: str | None, *, after_id: int, limit: int, actor: str | None = None
) -> list[dict[str, Any]]:
    """Dead letters, oldest first (of one queue and one actor, or all), each with its redacted preview."""
    rows = require_operation(broker, "dead_letters_list")(queue, limit=limit, after_id=after_id, actor=actor)
    return [
        {
            "id": d.id,
            "queue": d.queue,
            "message_id": d.message_id,
            "actor": d.actor,
            "reason": _clip(redact(d.reason), MAX_ERROR_CHARS) if d.reason else None,
            "deliveries": d.deliveries,
            "dead_at": from_ms(d.dead_at),
            **preview(d.body),
        }
        for d in rows
    ]


def preview(body: bytes) -> dict[str, Any]:
    """The safe fields of an encoded Dramatiq message (see the module docstring); ``decoded`` False
    when the body is not a message Dramatiq can read (nothing else is shown then)."""
    from dramatiq import Message

    try:
        message = Message.decode(body)
    except Exception:  # an undecodable body is why some letters died: say so, show nothing of it
        return dict(_UNDECODED)
    options = message.options if isinstance(message.options, dict) else {}
    schedule = options.get(SCHEDULE_OPTION)
    args = list(message.args or ())
    kwargs = dict(message.kwargs or {})
    return {
        "decoded": True,
        "args": [_arg(v) for v in args[:MAX_ARGS]]
        + ([f"… {len(args) - MAX_ARGS} more"] if len(args) > MAX_ARGS else []),
        "kwargs": {_clip(str(k), 40): _kwarg(str(k), v) for k, v in list(kwargs.items())[:MAX_ARGS]},
        "error": _last_line(options.get("traceback")),
        "job_id": _clip(str(options[JOB_ID_OPTION]), 64) if options.get(JOB_ID_OPTION) else None,
        "schedule": _clip(str(schedule.get("name")), 200) if isinstance(schedule, dict) else None,
        "enqueued_at": from_ms(message.message_timestamp) if isinstance(message.message_timestamp, int) else None,
        "retries": options.get("retries") if isinstance(options.get("retries"), int) else None,
    }


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _arg(value: Any) -> str:
    """One argument as a short, redacted text; containers only by their shape."""
    if value is None or isinstance(value, bool):
        return str(value).lower() if isinstance(value, bool) else "null"
    if isinstance(value, int | float):
        return str(value) if not isinstance(value, float) or math.isfinite(value) else "NaN"
    if isinstance(value, str):
        return '"' + _clip(redact(value), MAX_ARG_CHARS) + '"'
    if isinstance(value, dict):
        return f"{{object of {len(value)} key(s)}}"
    if isinstance(value, list | tuple):
        return f"[list of {len(value)}]"
    return f"<{type(value).__name__}>"


def _kwarg(name: str, value: Any) -> str:
    # redact() masks the value of ``name=value`` when the name says secret (token, password, auth…).
    if redact(f"{name}=x") != f"{name}=x":
        return "***"
    return _arg(value)


def _last_line(traceback: Any) -> str | None:
    """A traceback's last line (the exception), redacted; never the frames (paths, source, values)."""
    if not isinstance(traceback, str):
        return None
    lines = [line.strip() for line in traceback.strip().splitlines() if line.strip()]
    return _clip(redact(lines[-1]), MAX_ERROR_CHARS) if lines else None


def replay(broker: Any, queue: str, ids: list[int] | None, *, act: Audited | None = None) -> int:
    """Replay dead letters of *queue*: the given row ids, or all of it (in *act*'s transaction where the
    broker is on the job database)."""
    if queue not in known_queues(broker):
        raise NotFound(f"No queue named {queue!r}.")
    tx = joined(broker, act)
    replayed = int(require_operation(broker, "replay_dead")(queue, ids, **tx))
    if replayed and tx and act is not None:
        act.after_commit(lambda: broker.wake([q_name(queue)]))
    return replayed


def purge(broker: Any, queue: str, ids: list[int] | None, *, act: Audited | None = None) -> int:
    """Delete dead letters of *queue* for good: the given row ids, or all of it."""
    if queue not in known_queues(broker):
        raise NotFound(f"No queue named {queue!r}.")
    return int(require_operation(broker, "delete_dead")(queue, ids, **joined(broker, act)))


def bulk(
    broker: Any,
    action: str,
    match: DeadMatch,
    *,
    dry_run: bool,
    limit: int = MAX_BULK,
    act: Audited | None = None,
) -> dict[str, Any]:
    """Replay or purge every dead letter *match* selects (the oldest *limit*), or only count them
    (the action in *act*'s transaction where the broker is on the job database).

    A dry run answers ``through_id``: the newest row it counted. Confirming with that id acts on
    what the dry run counted and never on letters that died since.

    Returns:
      ``{"action", "dry_run", "matched", "affected", "through_id", "ids"}``: on a dry run what would be
      affected (``ids``: the first 100 of them), otherwise how many were.

    Raises:
      Invalid: Unknown action. NotFound: a queue the broker does not know. Unavailable: not the SQLite broker.
    """
    if action not in BULK_ACTIONS:
        raise Invalid("Unknown dead-letter action.", details={"action": [f"one of {', '.join(BULK_ACTIONS)}"]})
    if match.queue is not None and match.queue not in known_queues(broker):
        raise NotFound(f"No queue named {match.queue!r}.")
    matched, ids = require_operation(broker, "dead_letters_match")(match, limit=limit)
    if dry_run:
        return {
            "action": action,
            "dry_run": True,
            "matched": matched,
            "affected": len(ids),
            "through_id": max(ids) if ids else None,
            "ids": ids[:100],
        }
    method = "replay_dead_matching" if action == "replay" else "purge_dead_matching"
    tx = joined(broker, act)
    done = int(require_operation(broker, method)(match, limit=limit, **tx))
    if done and action == "replay" and tx and act is not None:
        # Which queues got letters back is the broker's to know: wake every one the filter could cover.
        queues = {q_name(match.queue)} if match.queue else set(known_queues(broker))
        act.after_commit(lambda: broker.wake(queues))
    return {
        "action": action,
        "dry_run": False,
        "matched": matched,
        "affected": done,
        "through_id": match.through_id,
        "ids": [],
    }
