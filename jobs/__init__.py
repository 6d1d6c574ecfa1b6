"""Tenure's job layer: durable job records bound to Dramatiq messages (see docs/jobs.md).

from jobs import registry, submit
@registry.kind("render", safe_to_rerun=True)
def render(ctx, *, recording_id): ...
registry.bind(broker)          # the process's composition root declares the actors
job = submit(engine, owner_id="u1", kind="render", payload={"recording_id": "r1"})
"""

from .attempts import AttemptRecord
from .context import JobContext, ResultTransaction
from .control import CancelOutcome, CancelResult, cancel, retry, run_now
from .current import current_job
from .db import make_engine
from .deletion import Deleted, delete_job
from .errors import (
    CursorExpired,
    IdempotencyConflict,
    JobCancelled,
    JobError,
    JobNotDeletable,
    JobNotFound,
    JobNotRetryable,
    JobStillExiting,
    JobTimeout,
    PayloadInvalid,
    SchemaMismatch,
    StaleAttempt,
    UnknownKind,
)
from .execution.binding import JobMiddleware, install
from .outbox import relay_once
from .queries import get_job, job_attempts, job_events, list_jobs
from .records import JobEventRecord, JobRecord
from .recovery import RecoveryReport, recover_expired
from .registry import Kind, Registry, registry
from .schema import check_database_at_head
from .status import JobStatus
from .submit import submit
from .workflows import (
    Extension,
    Step,
    StepView,
    WorkflowRequest,
    extend_workflow,
    retry_workflow,
    submit_workflow,
    workflow_graph,
    workflow_steps,
)

__all__ = [
    "Deleted",
    "JobNotDeletable",
    "delete_job",
    "CursorExpired",
    "CancelOutcome",
    "Extension",
    "AttemptRecord",
    "CancelResult",
    "IdempotencyConflict",
    "JobCancelled",
    "JobContext",
    "JobError",
    "JobEventRecord",
    "JobMiddleware",
    "JobNotFound",
    "JobNotRetryable",
    "JobStillExiting",
    "JobRecord",
    "JobStatus",
    "JobTimeout",
    "PayloadInvalid",
    "Kind",
    "RecoveryReport",
    "Registry",
    "ResultTransaction",
    "SchemaMismatch",
    "Step",
    "StepView",
    "StaleAttempt",
    "UnknownKind",
    "WorkflowRequest",
    "cancel",
    "check_database_at_head",
    "current_job",
    "extend_workflow",
    "get_job",
    "install",
    "job_attempts",
    "job_events",
    "list_jobs",
    "make_engine",
    "recover_expired",
    "registry",
    "relay_once",
    "retry",
    "retry_workflow",
    "run_now",
    "submit",
    "submit_workflow",
    "workflow_graph",
    "workflow_steps",
]
