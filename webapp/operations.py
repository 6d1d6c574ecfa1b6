"""Operators' view of the broker (queues, dead letters, workers) as plain dicts for the API and UI.

Only the SQLite broker has these operations; with Redis/RabbitMQ they answer 503 "unsupported"
(those brokers have their own consoles). The supervisors' slots (:func:`worker_slots`: restarts,
slots given up) come from the job database, so they are there with every broker.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from .errors import NotFound, Unavailable


def _ts(ms: int | float | None) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, UTC) if ms else None


def _need(broker: Any, name: str) -> Any:
    method = getattr(broker, name, None)
    if method is None:
        raise Unavailable(f"The {type(broker).__name__} has no {name.replace('_', ' ')} operation.")
    return method


def queues(broker: Any) -> list[dict[str, Any]]:
    """Depth by state, lag and pause flag of each queue (delay queues folded into their queue)."""
    rows = _need(broker, "stats")()
    return [
        {
            "queue": s.queue,
            "ready": s.ready,
            "delayed": s.delayed,
            "leased": s.leased,
            "dead": s.dead,
            "oldest_ready_age_s": None if s.oldest_ready_age_ms is None else s.oldest_ready_age_ms / 1000,
            "paused": bool(s.paused),
        }
        for s in rows
    ]


def known_queues(broker: Any) -> set[str]:
    names = {s["queue"] for s in queues(broker)}
    names.update(getattr(broker, "get_declared_queues", lambda: set())())
    return names


def set_paused(broker: Any, queue: str, paused: bool) -> dict[str, Any]:
    if queue not in known_queues(broker):
        raise NotFound(f"No queue named {queue!r}.")
    _need(broker, "pause" if paused else "resume")(queue)
    return {"queue": queue, "paused": paused}


def dead_letters(broker: Any, queue: str | None, *, after_id: int, limit: int) -> list[dict[str, Any]]:
    rows = _need(broker, "dead_letters_list")(queue, limit=limit, after_id=after_id)
    return [
        {
            "id": d.id,
            "queue": d.queue,
            "message_id": d.message_id,
            "actor": d.actor,
            "reason": d.reason,
            "deliveries": d.deliveries,
            "dead_at": _ts(d.dead_at),
        }
        for d in rows
    ]


def replay(broker: Any, queue: str, ids: list[int] | None) -> int:
    if queue not in known_queues(broker):
        raise NotFound(f"No queue named {queue!r}.")
    return int(_need(broker, "replay_dead")(queue, ids))


def workers(broker: Any) -> list[dict[str, Any]]:
    out = []
    for p in _need(broker, "processes")():
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
                "started_at": _ts(p.get("started_at")),
                "heartbeat_at": _ts(p.get("heartbeat_at")),
                "leased": int(p.get("leased") or 0),
            }
        )
    return out


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
            "last_exit_at": _ts(r.last_exit_at),
            "restart_at": _ts(r.restart_at),
            "started_at": _ts(r.started_at),
            "heartbeat_at": _ts(r.heartbeat_at),
        }
        for r in rows
    ]
