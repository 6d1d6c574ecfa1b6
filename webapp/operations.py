"""Operators' view of the broker (queues, workers) as plain dicts for the API and UI (dead letters:
:mod:`webapp.dead_letters`).

Queue depth comes from each broker's own counters (:mod:`broker.depth`: SQLite, Redis, RabbitMQ).
Pausing a queue, dead letters and the worker list are SQLite broker operations; with Redis/RabbitMQ
a pause is refused with the reason (:func:`pause_unavailable`, 409) and the others answer 503
"unsupported" (those brokers have their own consoles). The supervisors' slots (:func:`worker_slots`:
restarts, slots given up) come from the job database, so they are there with every broker.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from broker.depth import broker_kind, queue_depths
from jobs.publish import same_sqlite_file

from .errors import Conflict, NotFound, Unavailable

if TYPE_CHECKING:
    from .audit_log import Audited

logger = logging.getLogger(__name__)


class PauseUnavailable(Conflict):
    """This broker cannot pause a queue."""

    code = "pause_unavailable"


def from_ms(ms: int | float | None) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, UTC) if ms else None


def require_operation(broker: Any, name: str) -> Any:
    method = getattr(broker, name, None)
    if method is None:
        raise Unavailable(f"The {type(broker).__name__} has no {name.replace('_', ' ')} operation.")
    return method


def pause_unavailable(broker: Any) -> str | None:
    """Why queues on *broker* cannot be paused, or ``None`` when they can.

    The SQLite broker skips paused queues in its claim. Dramatiq's Redis and RabbitMQ brokers hand
    every message of a queue to its consumers and have no such switch; pausing there needs the job
    layer to hold back the claims of a paused queue, which it does not do yet. This is the one place
    that decides, so the UI and the API offer pausing as soon as it says ``None``.
    """
    if callable(getattr(broker, "pause", None)) and callable(getattr(broker, "resume", None)):
        return None
    return (
        f"Queues cannot be paused on the {type(broker).__name__}: it delivers every message of a queue "
        "to its consumers and has no switch to hold them back. Only the SQLite broker skips paused "
        "queues when workers claim messages; stop this queue's workers to stop its processing."
    )


def queues(broker: Any) -> list[dict[str, Any]]:
    """Depth by state, lag, consumers and pause flag of each queue (delay queues folded into their queue).

    A count the broker cannot tell is ``None`` (see :mod:`broker.depth`); ``pause_unavailable`` is the
    reason pausing is refused on this broker, or ``None``.

    Raises:
      Unavailable: The broker's counters are unknown here (neither SQLite, Redis nor RabbitMQ).
    """
    kind = broker_kind(broker)
    if kind is None:
        raise Unavailable(f"The {type(broker).__name__} has no queue statistics.")
    reason = pause_unavailable(broker)
    return [
        {
            "queue": d.queue,
            "broker": kind,
            "ready": d.ready,
            "delayed": d.delayed,
            "leased": d.leased,
            "dead": d.dead,
            "oldest_ready_age_s": None if d.oldest_ready_age_ms is None else d.oldest_ready_age_ms / 1000,
            "consumers": d.consumers,
            "paused": d.paused,
            "pause_unavailable": reason,
        }
        for d in queue_depths(broker)
    ]


def known_queues(broker: Any) -> set[str]:
    names = {s["queue"] for s in queues(broker)}
    names.update(q for q in getattr(broker, "get_declared_queues", lambda: set())() if not q.endswith((".DQ", ".XQ")))
    return names


def joined(broker: Any, act: Audited | None) -> dict[str, Any]:
    """The keyword that makes a broker operation join *act*'s transaction: ``{"connection": …}`` when the
    broker keeps its messages in the job database's SQLite file (the default deployment), else nothing —
    the broker then commits its change on its own, just before the audit record commits."""
    if act is None or not same_sqlite_file(act.connection, broker):
        return {}
    return {"connection": act.connection}


def _wake_after(broker: Any, act: Audited | None, queues: set[str], joined_tx: dict[str, Any]) -> None:
    # Changes made in the caller's transaction wake idle consumers once it has committed.
    if joined_tx and queues and act is not None:
        act.after_commit(lambda: broker.wake(queues))


def set_paused(broker: Any, queue: str, paused: bool, *, act: Audited | None = None) -> dict[str, Any]:
    """Pause or resume *queue* (in *act*'s transaction where the broker is on the job database).

    Raises:
      NotFound: No such queue.
      PauseUnavailable: The broker cannot pause queues (409, with the reason).
    """
    if queue not in known_queues(broker):
        raise NotFound(f"No queue named {queue!r}.")
    reason = pause_unavailable(broker)
    if reason is not None:
        raise PauseUnavailable(reason)
    tx = joined(broker, act)
    (broker.pause if paused else broker.resume)(queue, **tx)
    if not paused:
        _wake_after(broker, act, {queue}, tx)
    return {"queue": queue, "paused": paused}


def workers(broker: Any) -> list[dict[str, Any]]:
    out = []
    for p in require_operation(broker, "processes")():
        raw = p.get("queues") or []
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                raw = [q for q in raw.split(",") if q]
        out.append(
            {
                "owner": str(p.get("owner")),
                "host": p.get("host"),
                "pid": p.get("pid"),
                "queues": sorted(str(q) for q in raw),
                "started_at": from_ms(p.get("started_at")),
                "heartbeat_at": from_ms(p.get("heartbeat_at")),
                "leased": int(p.get("leased") or 0),
            }
        )
    return out


def unclean_exits(broker: Any) -> list[dict[str, Any]]:
    """Worker processes that ended without closing the broker (SIGKILL, OOM, a crash): the broker's
    unclean-exit marker's generations, newest first, until an operator acknowledges them."""
    return [
        {
            "owner": str(e["owner"]),
            "host": e["host"],
            "pid": e["pid"],
            "started_at": from_ms(e["started_at"]),
            "last_heartbeat_at": from_ms(e["last_heartbeat_at"]),
            "detected_at": from_ms(e["detected_at"]),
        }
        for e in require_operation(broker, "unclean_exits")()
    ]


def acknowledge_unclean_exits(broker: Any, owners: list[str], *, by: str, act: Audited | None = None) -> int:
    """Forget the unclean exits of *owners* (they leave the Workers page and readiness); how many.

    Logged with who acknowledged which, and recorded in the audit log by the caller (*act*)."""
    owners = list(dict.fromkeys(owners))
    count = int(require_operation(broker, "acknowledge_unclean_exits")(owners, **joined(broker, act)))
    logger.warning("%s acknowledged %d unclean exit(s): %s", by, count, ", ".join(owners))
    return count


def worker_slots(rows: list[Any]) -> list[dict[str, Any]]:
    """The supervisors' slots (``Services.worker_slots``) as the API and the Workers page show them."""
    return [
        {
            "role": r.role,
            "host": r.host,
            "supervisor_pid": r.supervisor_pid,
            "slot": r.slot,
            "state": r.state,
            "pid": r.pid,
            "restarts": r.restarts,
            "crashes": r.crashes,
            "last_exit": r.last_exit,
            "last_exit_at": from_ms(r.last_exit_at),
            "restart_at": from_ms(r.restart_at),
            "started_at": from_ms(r.started_at),
            "heartbeat_at": from_ms(r.heartbeat_at),
        }
        for r in rows
    ]
