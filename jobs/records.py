"""Public, frozen views of jobs and events (no payload, lease or worker internals)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .limits import owner_keyed
from .status import JobStatus
from .store import EventRow, JobRow


def _dt(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


@dataclass(frozen=True)
class JobRecord:
    """What an owner (or an admin) may see of a job.

    ``created`` is True only on the record returned by the ``submit`` call that created the job (an
    idempotent repeat returns the existing job with ``created=False``: HTTP 201 vs 200).
    """

    id: str
    owner_id: str
    kind: str
    queue: str
    status: JobStatus
    resource_type: str | None
    resource_id: str | None
    priority: int
    attempt: int
    max_attempts: int
    progress: float | None
    progress_message: str | None
    result: Any
    error: str | None
    cancel_requested: bool
    last_event_sequence: int
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    retry_of_job_id: str | None
    parent_job_id: str | None
    #: The kind's summary of the job (see :attr:`jobs.registry.Kind.summary`).
    summary: str | None = None
    created: bool = False
    #: Its last attempt timed out and its thread has not stopped yet: a retry waits (see jobs.exit_store).
    still_exiting: bool = False
    #: A queued job waiting for admission: what for (:func:`jobs.admission.waiting_detail`; in lists only
    #: ``reason`` and what it waits on, a job's own page also what is in use and the limit). None otherwise.
    waiting: dict[str, Any] | None = None

    @property
    def terminal(self) -> bool:
        return self.status.terminal

    @classmethod
    def from_row(
        cls,
        row: JobRow,
        *,
        created: bool = False,
        still_exiting: bool = False,
        waiting: dict[str, Any] | None = None,
    ) -> JobRecord:
        return cls(
            id=row.id,
            owner_id=row.owner_id,
            kind=row.kind,
            queue=row.queue_name,
            status=JobStatus(row.status),
            resource_type=row.resource_type,
            resource_id=row.resource_id,
            priority=row.priority,
            attempt=row.attempt,
            max_attempts=row.max_attempts,
            progress=row.progress,
            progress_message=row.progress_message,
            result=None if row.result is None else json.loads(row.result),
            error=row.error,
            cancel_requested=row.cancel_requested_at is not None,
            last_event_sequence=row.event_seq,
            created_at=_dt(row.created_at),  # type: ignore[arg-type]
            updated_at=_dt(row.updated_at),  # type: ignore[arg-type]
            started_at=_dt(row.started_at),
            completed_at=_dt(row.completed_at),
            retry_of_job_id=row.retry_of_job_id,
            parent_job_id=row.parent_job_id,
            summary=row.summary,
            created=created,
            still_exiting=still_exiting,
            waiting=waiting if waiting is not None or row.held is None else waiting_of(row.held, row.held_on or ""),
        )


def waiting_of(held: str, on: str) -> dict[str, Any]:
    """What a waiting job's row alone says it waits for (the reason, and the queue, key or workflow)."""
    if held in ("concurrency", "rate"):
        name, _, value = on.partition("=")
        return {"reason": held, "limit_name": name, "key": value, "key_is_owner": owner_keyed(name)}
    if held == "steps":
        return {"reason": held, "workflow": on}
    return {"reason": "fair_share", "queue": on}


@dataclass(frozen=True)
class JobEventRecord:
    job_id: str
    sequence: int
    type: str
    data: dict[str, Any]
    created_at: datetime

    @classmethod
    def from_row(cls, row: EventRow) -> JobEventRecord:
        return cls(row.job_id, row.sequence, row.type, json.loads(row.data), _dt(row.created_at))  # type: ignore[arg-type]
