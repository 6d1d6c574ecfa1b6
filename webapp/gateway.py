"""The records the web layer shows: jobs, events, notices, kinds, activity, schedules.

Views and the live feed get them from :class:`webapp.jobs_adapter.JobLayerGateway`, held in
``app.extensions["tenure"]``; they never run SQL. The gateway is also where the job layer's
exceptions become the web layer's (:mod:`webapp.errors`): a foreign job is
:class:`~webapp.errors.JobNotFoundError`, exactly like a missing one.

A *scope* is the owner id whose jobs a caller may see, or ``None`` for an admin (all jobs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: Every job status (docs/architecture.md, jobs/status.py).
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
    parent_job_id: str | None = None
    #: The kind's short description of the job (its folder, its clip window); never the payload.
    summary: str | None = None
    files: tuple[str, ...] = ()
    #: Its last attempt timed out and its thread has not stopped yet: a retry answers 409 until it has.
    still_exiting: bool = False

    @property
    def can_cancel(self) -> bool:
        return self.status in ("queued", "running") and not self.cancel_requested

    @property
    def can_retry(self) -> bool:
        return self.status in RETRYABLE and not self.still_exiting

    @property
    def can_delete(self) -> bool:
        """Finished and no workflow step (a step goes with its workflow). A job another one refers to
        (its retry) may still be refused."""
        return self.status in TERMINAL and self.parent_job_id is None


@dataclass(frozen=True)
class AttemptView:
    """One attempt of a job: when it ran, how it ended (``outcome``), what the job did next (``next``)."""

    attempt: int
    started_at: datetime
    ended_at: datetime | None
    outcome: str
    next: str | None = None
    error: str | None = None
    host: str | None = None


@dataclass(frozen=True)
class StepView:
    """One step of a workflow: its name, its job, the steps it runs after, and whether it was reused
    (a retried workflow's step that had succeeded in the workflow it retries)."""

    name: str
    job: JobView
    depends_on: tuple[str, ...] = ()
    reused: bool = False


@dataclass(frozen=True)
class WorkflowView:
    """A workflow's DAG: its steps in creation order."""

    steps: tuple[StepView, ...]

    @property
    def failed(self) -> tuple[StepView, ...]:
        """The steps that ended failed or interrupted (what the workflow's failure names)."""
        return tuple(s for s in self.steps if s.job.status in ("failed", "interrupted"))


@dataclass(frozen=True)
class Cue:
    """One line of a transcript: shown from ``start_s`` to ``end_s`` (seconds)."""

    start_s: float
    end_s: float
    text: str


@dataclass(frozen=True)
class EventView:
    """One entry of a job's timeline (``sequence`` is per job and gap-free)."""

    sequence: int
    type: str
    data: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class Notice:
    """One item of the live feed: something happened to a job. ``id`` is its change cursor (a token)."""

    id: str
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
    #: ``null`` is accepted.
    nullable: bool = False
    #: The form's words and bounds (from the kind's payload schema).
    label: str = ""
    unit: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    #: The field whose value this one must exceed (an end after its start).
    after: str | None = None


@dataclass(frozen=True)
class KindInfo:
    """A job kind that can be submitted."""

    name: str
    title: str
    description: str = ""
    queue: str = "default"
    fields: tuple[FieldSpec, ...] = ()
    #: The payload's JSON Schema (what the API's OpenAPI document embeds).
    payload_schema: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JobQuery:
    """Filters of the job list; every field is optional."""

    statuses: tuple[str, ...] = ()
    kind: str | None = None
    queue: str | None = None
    owner_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    #: Text search: one term, or several that a job must all match.
    search: str | tuple[str, ...] | None = None
    parent_job_id: str | None = None
    #: Only jobs that are no workflow step (the list grouped by workflow).
    top_level: bool = False


@dataclass(frozen=True)
class Page:
    items: list[JobView]
    next_cursor: str | None


@dataclass(frozen=True)
class ActivityBucket:
    """Finished jobs in one time bucket (for the operations charts)."""

    start: datetime
    #: The queue or kind of a grouped chart (None: all jobs).
    group: str | None = None
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    wait_p50_s: float | None = None
    run_p50_s: float | None = None
    run_p95_s: float | None = None
    run_max_s: float | None = None


@dataclass(frozen=True)
class FireView:
    """One recorded fire of a schedule and what else happened to its tick.

    ``cause``: ``schedule`` (on time), ``catchup`` (late, after downtime) or ``manual`` (run now).
    ``duplicates``: other attempts at this tick that were refused because it had fired.
    ``skipped``: scheduled ticks before this one that never fired (catch-up policy or grace window),
    the earliest at ``skipped_from``; with ``skipped_more``, more than ``skipped`` (counting stopped).
    """

    tick: datetime
    cause: str
    fired_at: datetime
    due_at: datetime
    fired_by: str
    job_id: str | None = None
    message_id: str | None = None
    duplicates: int = 0
    skipped: int = 0
    skipped_more: bool = False
    skipped_from: datetime | None = None


@dataclass(frozen=True)
class ScheduleView:
    """A schedule: its declaration, its state and its newest fires (newest first).

    ``next_fire_at`` is the next tick that will fire: None while paused or when no longer declared.
    ``kind`` is the actor it sends a message to, or with ``job_kind`` the trigger of a job schedule.
    """

    name: str
    cron: str
    kind: str | None = None
    job_kind: str | None = None
    next_fire_at: datetime | None = None
    last_fire_at: datetime | None = None
    paused: bool = False
    paused_by: str | None = None
    paused_at: datetime | None = None
    queue: str | None = None
    declared: bool = True
    catchup: str | None = None
    grace_s: float | None = None
    jitter_s: float | None = None
    #: Delivery delay after each tick that this schedule's jitter picked.
    jitter_offset_s: float = 0.0
    max_staleness_s: float | None = None
    fires: tuple[FireView, ...] = ()


class CursorExpired(Exception):
    """The feed cursor points before the oldest retained notice (or is not one this database handed
    out: *unknown*); the client must resync from *head*."""

    def __init__(self, head: str, *, unknown: bool = False) -> None:
        super().__init__(f"cursor {'unknown' if unknown else 'expired'}; head is {head}")
        self.head = head
        self.unknown = unknown
