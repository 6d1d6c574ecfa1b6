"""Workflows: a parent job whose steps form a DAG (fan-out, fan-in, fail-fast, retry from failures).

- ``submit_workflow`` writes the parent (``running`` at once: its steps drive it, no worker
  leases it — ``worker_id = 'workflow'`` and a lease that never expires), the steps (``queued``
  jobs with ``parent_job_id``) and their edges in ``job_dependencies``, all in one transaction;
  steps without dependencies get their message in that transaction too.
- A step waiting for dependencies is ``queued`` without a message. Whether the steps after a
  step are ready is decided in the SAME transaction that completes the step: the parent row is
  locked first (``FOR UPDATE``; SQLite holds its write lock), so two steps finishing together
  cannot both miss that their common dependent became ready.
- Fail-fast: a step ending failed, cancelled or interrupted fails the parent at once, cancels the
  queued steps and asks the running ones to stop. Cancelling the parent does the same and ends it
  ``cancelled`` once no step runs any more.
- ``retry_workflow`` makes a NEW parent that re-runs only the steps that did not succeed; steps
  that succeeded are reused (their dependents depend on the old, succeeded rows).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from . import db, events, store
from .errors import JobNotFound, JobNotRetryable
from .notify import Notice
from .publish import prepare_broker, publish_in_transaction, resolve_broker
from .records import JobRecord
from .registry import Registry
from .registry import registry as default_registry
from .settings import Settings, current_settings
from .status import JobStatus
from .submit import _submit_in, new_job_row, request_digest

#: Config key naming a step inside its workflow.
STEP_KEY = "workflow_step"
#: Config key of a retried workflow: steps reused from the workflow it retries.
REUSED_KEY = "workflow_reused_steps"


@dataclass(frozen=True)
class Step:
    """One step of a workflow: a job of *kind* that runs after the steps named in *depends_on*."""

    name: str
    kind: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    depends_on: Sequence[str] = ()
    max_attempts: int | None = None
    timeout_s: int | None = None


def _check_dag(steps: Sequence[Step]) -> list[Step]:
    """Validate names and edges; returns the steps in a topological order.

    Raises:
      ValueError: Duplicate or empty names, unknown dependencies, or a cycle.
    """
    by_name: dict[str, Step] = {}
    for step in steps:
        if not step.name or step.name in by_name:
            raise ValueError(f"step names must be unique and non-empty, got {step.name!r} twice or empty")
        by_name[step.name] = step
    for step in steps:
        for dep in step.depends_on:
            if dep not in by_name:
                raise ValueError(f"step {step.name!r} depends on unknown step {dep!r}")
    order: list[Step] = []
    state: dict[str, int] = {}

    def visit(step: Step, path: tuple[str, ...]) -> None:
        if state.get(step.name) == 2:
            return
        if state.get(step.name) == 1:
            raise ValueError(f"the steps form a cycle: {' -> '.join((*path, step.name))}")
        state[step.name] = 1
        for dep in step.depends_on:
            visit(by_name[dep], (*path, step.name))
        state[step.name] = 2
        order.append(step)

    for step in steps:
        visit(step, ())
    return order


def submit_workflow(
    engine: Engine,
    *,
    owner_id: str,
    name: str,
    steps: Sequence[Step],
    resource: tuple[str, str] | None = None,
    idempotency_key: str | None = None,
    registry: Registry | None = None,
    settings: Settings | None = None,
    retry_of_job_id: str | None = None,
    reused: Mapping[str, str] | None = None,
) -> JobRecord:
    """Create a workflow: its parent job, its steps and their dependencies, in one transaction.

    Parameters:
      engine: The job database.
      owner_id: Owner of the parent and every step.
      name: The workflow's kind (what lists show); need not be registered.
      steps: The DAG; every step's kind must be registered.
      resource, idempotency_key: As for :func:`jobs.submit` (the key is scoped by owner and *name*).
      reused: For retries: step name → id of an already succeeded step that satisfies dependencies.

    Raises:
      ValueError: An invalid DAG (duplicate names, unknown dependency, cycle) or no steps.
      UnknownKind: A step's kind is not registered.
      IdempotencyConflict: The key was used for a different workflow.

    Returns:
      The parent's record (``created`` as for ``submit``).
    """
    registry = registry or default_registry
    settings = settings or current_settings()
    reused = dict(reused or {})
    if not steps:
        raise ValueError("a workflow needs at least one step")
    order = _check_dag([*steps, *(Step(n, "") for n in reused)])
    order = [s for s in order if s.name not in reused]
    kinds = {s.name: registry.get(s.kind) for s in order}
    snapshot = settings.job_snapshot()
    description = [
        {"name": s.name, "kind": s.kind, "payload": dict(s.payload), "after": sorted(s.depends_on)} for s in steps
    ]
    parent = new_job_row(
        owner_id=owner_id,
        kind=name,
        actor_name="",
        queue_name="",
        safe_to_rerun=False,
        payload={"steps": description},
        resource=resource,
        idempotency_key=idempotency_key,
        priority=0,
        delay=None,
        max_attempts=1,
        timeout_s=settings.job_timeout_s,
        config={**snapshot, REUSED_KEY: reused} if reused else snapshot,
        retry_of_job_id=retry_of_job_id,
        digest=request_digest(name, {"steps": description}, resource),
    )
    for k in {id(k): k for k in kinds.values()}.values():
        prepare_broker(k.actor.broker, k.queue)

    def add_steps(tx: db.Tx, parent_row: dict[str, Any]) -> None:
        now = store.now_ms()
        seq = store.job_workflow_start(tx.conn, parent_row["id"], now)
        assert seq is not None
        events.status_event(tx, job_id=parent_row["id"], owner_id=owner_id, sequence=seq, status="running", now=now)
        ids: dict[str, str] = dict(reused)
        for step in order:
            k = kinds[step.name]
            row = new_job_row(
                owner_id=owner_id,
                kind=k.name,
                actor_name=k.actor.actor_name,
                queue_name=k.actor.queue_name,
                safe_to_rerun=k.safe_to_rerun,
                payload=step.payload,
                resource=resource,
                idempotency_key=None,
                priority=0,
                delay=None,
                max_attempts=step.max_attempts or k.max_attempts or settings.max_attempts,
                timeout_s=step.timeout_s or k.timeout_s or settings.job_timeout_s,
                config={**snapshot, STEP_KEY: step.name},
                parent_job_id=parent_row["id"],
            )
            ids[step.name] = row["id"]
            store.job_insert(tx.conn, row)
            events.status_event(tx, job_id=row["id"], owner_id=owner_id, sequence=1, status="queued", now=now)
            for dep in step.depends_on:
                store.dependency_insert(tx.conn, row["id"], ids[dep])
            if store.dependency_unmet_count(tx.conn, row["id"]) == 0:
                publish_in_transaction(
                    tx.conn,
                    k.actor.broker,
                    job_id=row["id"],
                    actor_name=row["actor_name"],
                    queue_name=row["queue_name"],
                    priority=0,
                    delay_ms=0,
                    now=now,
                )

    with db.write(engine) as tx:
        return _submit_in(tx, parent, None, 0, after_insert=add_steps)


def on_job_finished(tx: db.Tx, job_id: str, status: str) -> None:
    """Move the workflow of step *job_id* on, inside the transaction that gave the step its final status."""
    conn = tx.conn
    parent_id = store.job_workflow_parent_id(conn, job_id)
    if parent_id is None:
        return
    parent = store.job_get_for_update(conn, parent_id)  # serialises the steps of one workflow
    if parent is None or parent.status != JobStatus.RUNNING or parent.worker_id != store.WORKFLOW_WORKER:
        return
    now = store.now_ms()
    cancel_requested = parent.cancel_requested_at is not None
    if status == JobStatus.SUCCEEDED and not cancel_requested:
        broker = tx.broker or resolve_broker(None)
        for step in store.dependency_ready_dependents(conn, job_id):
            publish_in_transaction(
                conn,
                broker,
                job_id=step.id,
                actor_name=step.actor_name,
                queue_name=step.queue_name,
                priority=step.priority,
                delay_ms=0,
                now=now,
            )
    children = store.job_children(conn, parent_id)
    done = [c for c in children if JobStatus(c.status).terminal]
    if all(c.status == JobStatus.SUCCEEDED for c in children):
        reused = json.loads(parent.config).get(REUSED_KEY, {})
        steps = {**reused, **{json.loads(c.config).get(STEP_KEY, c.id): c.id for c in children}}
        _finish_parent(tx, parent, "succeeded", store.dumps({"steps": steps}), None, now)
        return
    store.job_workflow_progress(conn, parent_id, round(len(done) / max(1, len(children)), 4), now)
    tx.notify(Notice(parent_id, parent.owner_id, "progress", "running", parent.event_seq))
    if status != JobStatus.SUCCEEDED and not cancel_requested:
        step = next(c for c in children if c.id == job_id)
        name = json.loads(step.config).get(STEP_KEY, step.id)
        error = f"step {name} {status}" + (f": {step.error}" if step.error else "")
        _finish_parent(tx, parent, "failed", None, error[:500], now)
        _stop_steps(tx, children, now)
    elif cancel_requested and len(done) == len(children):
        _finish_parent(tx, parent, "cancelled", None, None, now)


def _finish_parent(
    tx: db.Tx, parent: store.JobRow, status: str, result: str | None, error: str | None, now: int
) -> None:
    seq = store.job_workflow_finish(tx.conn, parent.id, status, result, error, now)
    if seq is not None:
        data = {"error": error} if error else {}
        events.status_event(
            tx, job_id=parent.id, owner_id=parent.owner_id, sequence=seq, status=status, now=now, **data
        )


def _stop_steps(tx: db.Tx, children: list[store.JobRow], now: int) -> None:
    """Cancel the queued steps and ask the running ones to stop (fail-fast, or the parent's cancel)."""
    for child in children:
        if child.status == JobStatus.QUEUED:
            seq = store.job_cancel_queued(tx.conn, child.id, now)
            if seq is not None:
                events.status_event(
                    tx, job_id=child.id, owner_id=child.owner_id, sequence=seq, status="cancelled", now=now,
                    reason="workflow stopped",
                )  # fmt: skip
        elif child.status == JobStatus.RUNNING:
            seq = store.job_request_cancel(tx.conn, child.id, now)
            if seq is not None:
                events.record(
                    tx,
                    job_id=child.id,
                    owner_id=child.owner_id,
                    sequence=seq,
                    type_="cancel_requested",
                    data={"by": "workflow"},
                    status="running",
                    now=now,
                )


def cancel_children(tx: db.Tx, parent: store.JobRow) -> None:
    """The parent's cancel request reaches its steps; the parent ends cancelled once none runs."""
    now = store.now_ms()
    children = store.job_children(tx.conn, parent.id)
    _stop_steps(tx, children, now)
    if all(JobStatus(c.status).terminal for c in store.job_children(tx.conn, parent.id)):
        _finish_parent(tx, parent, "cancelled", None, None, now)


def workflow_steps(engine: Engine, parent_id: str, *, owner_id: str, is_admin: bool = False) -> list[JobRecord]:
    """The steps of a workflow, in creation order.

    Raises:
      JobNotFound: No such workflow, or another owner's.
    """
    with db.read(engine) as conn:
        parent = store.job_get(conn, parent_id)
        if parent is None or (not is_admin and parent.owner_id != owner_id):
            raise JobNotFound()
        return [JobRecord.from_row(c) for c in store.job_children(conn, parent_id)]


def retry_workflow(
    engine: Engine,
    parent_id: str,
    *,
    by: str,
    is_admin: bool = False,
    registry: Registry | None = None,
    settings: Settings | None = None,
) -> JobRecord:
    """Retry a failed or cancelled workflow from its failed steps: a NEW parent re-runs every step
    that did not succeed, reusing the ones that did.

    Raises:
      JobNotFound: No such workflow, or another owner's.
      JobNotRetryable: The workflow did not fail/cancel, or one of its steps is still running.

    Returns:
      The new parent's record.
    """
    with db.read(engine) as conn:
        parent = store.job_get(conn, parent_id)
        if parent is None or (not is_admin and parent.owner_id != by):
            raise JobNotFound()
        children = store.job_children(conn, parent_id)
    if parent.status not in (JobStatus.FAILED, JobStatus.CANCELLED) or not children:
        raise JobNotRetryable(f"workflow {parent_id} is {parent.status}; only failed or cancelled workflows retry")
    if any(not JobStatus(c.status).terminal for c in children):
        raise JobNotRetryable(f"workflow {parent_id} still has running steps; retry once they have stopped")
    old = json.loads(parent.payload)["steps"]
    succeeded = {json.loads(c.config).get(STEP_KEY): c.id for c in children if c.status == JobStatus.SUCCEEDED}
    previously_reused = json.loads(parent.config).get(REUSED_KEY, {})
    reused = {**previously_reused, **succeeded}
    steps = [Step(s["name"], s["kind"], s["payload"], tuple(s["after"])) for s in old if s["name"] not in reused]
    resource = (parent.resource_type, parent.resource_id) if parent.resource_type is not None else None
    return submit_workflow(
        engine,
        owner_id=parent.owner_id,
        name=parent.kind,
        steps=steps,
        resource=resource,  # type: ignore[arg-type]
        registry=registry,
        settings=settings,
        retry_of_job_id=parent.id,
        reused=reused,
    )
