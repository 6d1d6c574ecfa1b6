"""What the web layer needs from the job layer, as one narrow interface.

Views and the live feed talk to a :class:`JobsGateway` held in ``app.extensions["tenure"]``; they
never run SQL. :mod:`webapp.jobs_adapter` implements it over ``jobs`` (issue 3); tests may pass any
other implementation through ``create_app({"TENURE_JOBS": …})``. The gateway is also where the
job layer's exceptions become the web layer's (:mod:`webapp.errors`): a foreign job is
:class:`~webapp.errors.JobNotFoundError`, exactly like a missing one.

A *scope* is the owner id whose jobs a caller may see, or ``None`` for an admin (all jobs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

#: Every job status (ARCHITECTURE.md §5).
STATUSES = ("queued", "running", "succeeded", "failed", "cancelled", "interrupted")
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "interrupted"})
RETRYABLE = frozenset({"failed", "cancelled", "interrupted"})


@dataclass(frozen=True)
class JobView:
    """A job as callers may see it: no payload, lease or worker internals."""

    id: str
    owner_id: str
    kind: str
    status: str
    queue: str
    priority: int
    attempt: int
    max_attempts: int
    created_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None
    progress: float | None = None
    progress_message: str | None = None
    cancel_requested: bool = False
    error: str | None = None
    result: Any = None
    retry_of_job_id: str | None = None
    files: tuple[str, ...] = ()

    @property
    def can_cancel(self) -> bool:
        return self.status in ("queued", "running") and not self.cancel_requested

    @property
    def can_retry(self) -> bool:
        return self.status in RETRYABLE


@dataclass(frozen=True)
class EventView:
    """One entry of a job's timeline (``sequence`` is per job and gap-free)."""

    sequence: int
    type: str
    data: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class Notice:
    """One item of the live feed: something happened to a job. ``id`` is the global, increasing cursor."""

    id: int
    job_id: str
    owner_id: str
    type: str
    status: str | None = None
    progress: float | None = None
    message: str | None = None
    created_at: datetime | None = None


@dataclass(frozen=True)
class FieldSpec:
    """One input of a kind's submit form (rendered by the UI, validated by the gateway)."""

    name: str
    type: str = "string"  # string | text | integer | number | boolean | list (of strings) | object
    required: bool = False
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] = ()
    #: ``null`` is accepted (the parameter defaults to ``None``).
    nullable: bool = False


@dataclass(frozen=True)
class KindInfo:
    """A job kind that can be submitted."""

    name: str
    title: str
    description: str = ""
    queue: str = "default"
    fields: tuple[FieldSpec, ...] = ()


@dataclass(frozen=True)
class JobQuery:
    """Filters of the job list; every field is optional."""

    statuses: tuple[str, ...] = ()
    kind: str | None = None
    queue: str | None = None
    owner_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    search: str | None = None


@dataclass(frozen=True)
class Page:
    items: list[JobView]
    next_cursor: str | None


@dataclass(frozen=True)
class ActivityBucket:
    """Finished jobs in one time bucket (for the operations charts)."""

    start: datetime
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    wait_p50_s: float | None = None
    run_p50_s: float | None = None
    run_p95_s: float | None = None


@dataclass(frozen=True)
class ScheduleView:
    name: str
    cron: str
    kind: str | None = None
    next_fire_at: datetime | None = None
    last_fire_at: datetime | None = None
    paused: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class CursorExpired(Exception):
    """The feed cursor points before the oldest retained notice; the client must resync."""

    def __init__(self, head: int) -> None:
        super().__init__(f"cursor expired; head is {head}")
        self.head = head


class JobsGateway(Protocol):
    """The job layer as the web layer uses it. ``scope`` is an owner id, or ``None`` for admins."""

    def kinds(self) -> list[KindInfo]: ...

    def submit(
        self,
        *,
        owner_id: str,
        kind: str,
        payload: dict[str, Any],
        idempotency_key: str | None,
        priority: int,
        delay_s: float,
    ) -> tuple[JobView, bool]:
        """Returns (job, created). Raises Invalid (unknown kind, bad payload), Conflict (key reused)."""
        ...

    def get(self, scope: str | None, job_id: str) -> JobView: ...

    def list_jobs(self, scope: str | None, query: JobQuery, *, cursor: str | None, limit: int) -> Page: ...

    def count_jobs(self, scope: str | None, query: JobQuery) -> int: ...

    def events(self, scope: str | None, job_id: str, *, after: int, limit: int) -> list[EventView]: ...

    def cancel(self, scope: str | None, job_id: str, *, by: str | None = None) -> tuple[JobView, str]:
        """Returns (job, outcome) with outcome ``cancelled`` or ``cancel_requested``; Conflict when finished.
        *by* is the acting user's owner id (recorded in the job's events)."""
        ...

    def retry(self, scope: str | None, job_id: str, *, by: str | None = None) -> tuple[JobView, bool]:
        """(the NEW job, created). A job is retried once: asking again returns that retry with created
        False. Conflict when the job's status does not allow a retry."""
        ...

    def notices(self, scope: str | None, *, after: int, limit: int) -> tuple[list[Notice], int]:
        """Notices with ``id > after`` visible to *scope*, oldest first, and the newest id examined
        (so a subscriber skips past others' notices). Raises :class:`CursorExpired`."""
        ...

    def head(self) -> int:
        """The newest notice id (0 when there is none)."""
        ...

    def activity(self, scope: str | None, *, since: datetime, bucket_s: int) -> list[ActivityBucket]: ...

    def output_file(self, scope: str | None, job_id: str, name: str) -> Path:
        """The path of one of the job's produced files. NotFound when the job or file is unknown."""
        ...

    def schedules(self) -> list[ScheduleView]: ...

    def run_schedule_now(self, name: str, *, owner_id: str) -> dict[str, Any]:
        """Fire a schedule once now: ``{"schedule", "job_id", "message_id", "fired_at"}``. NotFound if unknown."""
        ...

    def set_schedule_paused(self, name: str, paused: bool, *, by: str) -> dict[str, Any]:
        """Pause or resume a schedule everywhere: ``{"name", "paused"}``. NotFound if unknown."""
        ...
