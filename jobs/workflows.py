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
- A step may extend its own workflow while it completes (``extend_workflow`` inside its
  ``result_transaction``): steps only known once it has run (one per imported segment, say) are
  inserted with their edges in the transaction that records its success, so they exist iff it
  succeeded, and those waiting for it are released by that same commit.
- A workflow *kind* (``registry.workflow``) makes ``jobs.submit`` of that kind create a workflow, so
  the API, the UI and Python submit one the same way (``submit_workflow_kind``).
- The parent's payload describes every step (``{"steps": [{"name", "kind", "payload", "after",
  "config"}]}``, extensions appended), which is what a retry re-runs from; its progress is the mean of
  its steps' (a finished step counts 1, and so does each step a retry reuses).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from settings.environment import Settings, current_settings

from . import admission, dag, db, events, read_store, store, transitions
from .admission_store import STEPS
from .dag import REUSED_KEY, STEP_KEY
from .enqueue import candidate, insert, new_job_row, request_digest, retry_key
from .errors import JobCancelled, JobNotFound, JobNotRetryable, PayloadInvalid
from .publish import prepare_broker
from .records import JobRecord
from .registry import WORKFLOW_QUEUE, Kind, Registry
from .registry import registry as default_registry
from .status import JobStatus

__all__ = ["REUSED_KEY", "STEP_KEY"]


@dataclass(frozen=True)
class Step:
    """One step of a workflow: a job of *kind* that runs after the steps named in *depends_on*."""

    name: str
    kind: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    depends_on: Sequence[str] = ()
    max_attempts: int | None = None
    timeout_s: int | None = None
    #: Extra entries for the step's config snapshot (``ctx.config``): instructions for the step that
    #: are not part of its kind's payload (e.g. what a step should add when it extends the workflow).
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkflowRequest:
    """What a workflow kind's function gets besides the payload (see ``Registry.workflow``)."""

    owner_id: str
    kind: str
    settings: Settings


@dataclass(frozen=True)
class Extension:
    """What :func:`extend_workflow` did: the workflow and every step it now has."""

    parent_id: str
    #: Step name → job id, for every step of the workflow (existing, reused and new).
    step_ids: Mapping[str, str]


@dataclass(frozen=True)
class StepView:
    """One step of a workflow as :func:`workflow_graph` shows it."""

    name: str
    job: JobRecord
    depends_on: tuple[str, ...]
    #: A step of the workflow this one retries, reused because it had succeeded.
    reused: bool


def _describe(step: Step) -> dict[str, Any]:
    """A step as the parent's payload keeps it (what a retry re-creates it from)."""
    described: dict[str, Any] = {
        "name": step.name,
        "kind": step.kind,
        "payload": dict(step.payload),
        "after": sorted(step.depends_on),
    }
    if step.config:
        described["config"] = dict(step.config)
    return described


def _step_from(described: Mapping[str, Any]) -> Step:
    return Step(
        described["name"],
        described["kind"],
        described["payload"],
        tuple(described["after"]),
        config=described.get("config") or {},
    )


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
    target: Engine | Session,
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
    request: Mapping[str, Any] | None = None,
    delay: float | timedelta | None = None,
    summary: str | None = None,
) -> JobRecord:
    """Create a workflow: its parent job, its steps and their dependencies, in one transaction.

    Parameters:
      target: The job database, or a Session whose transaction to join (as for :func:`jobs.submit`).
      owner_id: Owner of the parent and every step.
      name: The workflow's kind (what lists show); need not be registered.
      steps: The DAG; every step's kind must be registered.
      resource, idempotency_key: As for :func:`jobs.submit` (the key is scoped by owner and *name*).
      reused: For retries: step name → id of an already succeeded step that satisfies dependencies.
      request: The payload the workflow was submitted with (a workflow kind's): kept in the parent's
        payload, and "the same request" for the idempotency key means the same *request* (default:
        the same steps).
      delay: Seconds (or a timedelta) before the first steps may start; the workflow shows running
        meanwhile, its first steps queued with that wait.
      summary: The parent's summary line (a workflow kind's :meth:`~jobs.registry.Kind.summarize`).

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
    kinds = {s.name: _step_kind(registry, s) for s in order}
    snapshot = settings.job_snapshot()
    description = [_describe(s) for s in steps]
    payload: dict[str, Any] = {"steps": description}
    if request is not None:
        payload["request"] = dict(request)
    parent = new_job_row(
        owner_id=owner_id,
        kind=name,
        actor_name="",
        queue_name=WORKFLOW_QUEUE,
        safe_to_rerun=False,
        payload=payload,
        resource=resource,
        idempotency_key=idempotency_key,
        priority=0,
        delay=None,
        max_attempts=1,
        timeout_s=settings.job_timeout_s,
        config={**snapshot, REUSED_KEY: reused} if reused else snapshot,
        retry_of_job_id=retry_of_job_id,
        digest=request_digest(name, dict(request) if request is not None else {"steps": description}, resource),
        summary=summary,
    )
    for k in {id(k): k for k in kinds.values()}.values():
        prepare_broker(registry.broker_for(k.name), k.queue)

    def add_steps(tx: db.Tx, parent_row: dict[str, Any]) -> None:
        now = store.now_ms()
        transitions.start_workflow(tx, parent_row["id"], now=now)
        _insert_steps(
            tx,
            parent_id=parent_row["id"],
            owner_id=owner_id,
            resource=resource,
            snapshot=snapshot,
            order=order,
            kinds=kinds,
            ids=dict(reused),
            settings=settings,
            registry=registry,
            now=now,
            delay=delay,
        )
        if reused:  # a retry starts where its workflow got to: the reused steps are done
            fraction = round(len(reused) / (len(reused) + len(order)), 4)
            store.job_workflow_progress(tx.conn, parent_row["id"], fraction, now)

    if isinstance(target, Session):
        return insert(db.session_tx(target), parent, None, 0, after_insert=add_steps)
    with db.write(target) as tx:
        return insert(tx, parent, None, 0, after_insert=add_steps)


def _step_kind(registry: Registry, step: Step) -> Kind:
    """The kind of *step*, whose payload it checks.

    Raises:
      UnknownKind: No such kind.
      ValueError: A workflow kind (a step must be a job kind).
      PayloadInvalid: The step's payload does not fit its kind (fields named ``<step>.<field>``).
    """
    kind = registry.get(step.kind)
    if kind.workflow:
        raise ValueError(f"step {step.name!r}: {step.kind!r} is a workflow kind; a step must be a job kind")
    problems = kind.schema.problems(dict(step.payload))
    if problems:
        raise PayloadInvalid({f"{step.name}.{name}": reasons for name, reasons in problems.items()})
    return kind


def _insert_steps(
    tx: db.Tx,
    *,
    parent_id: str,
    owner_id: str,
    resource: tuple[str, str] | None,
    snapshot: Mapping[str, Any],
    order: Sequence[Step],
    kinds: Mapping[str, Kind],
    ids: dict[str, str],
    settings: Settings,
    registry: Registry,
    now: int,
    delay: float | timedelta | None = None,
) -> dict[str, str]:
    """Insert *order* (topologically sorted) as queued steps of *parent_id* with their edges; steps
    whose dependencies have all succeeded get their message now. *ids* maps the names already known
    (existing or reused steps) to job ids and is extended with the new ones."""
    for step in order:
        k = kinds[step.name]
        row = new_job_row(
            owner_id=owner_id,
            kind=k.name,
            actor_name=k.name,
            queue_name=k.queue,
            safe_to_rerun=k.safe_to_rerun,
            payload=step.payload,
            resource=resource,
            idempotency_key=None,
            priority=0,
            delay=None if step.depends_on else delay,  # later steps wait for their dependencies
            max_attempts=step.max_attempts or k.max_attempts or settings.max_attempts,
            timeout_s=step.timeout_s or k.timeout_s or settings.job_timeout_s,
            config={**snapshot, **dict(step.config), STEP_KEY: step.name},
            parent_job_id=parent_id,
            summary=k.summarize(dict(step.payload)),
            limit_keys=k.limit_keys(owner_id, dict(step.payload)),
        )
        ids[step.name] = row["id"]
        row["held"], row["held_on"] = STEPS, parent_id  # until its dependencies have succeeded
        store.job_insert(tx.conn, row)
        events.status_event(tx, job_id=row["id"], sequence=1, status="queued", now=now)
        for dep in step.depends_on:
            store.dependency_insert(tx.conn, row["id"], ids[dep])
        if store.dependency_unmet_count(tx.conn, row["id"]) == 0:
            admission.admit(
                tx,
                candidate(row),
                now=now,
                delay_ms=max(0, row["run_after"] - now),  # the message is due exactly when the row says
                broker=registry.broker_for(k.name),
                waiting=(STEPS, parent_id),
            )
    return ids


def submit_workflow_kind(
    target: Engine | Session,
    kind: Kind,
    *,
    owner_id: str,
    payload: Mapping[str, Any] | None,
    resource: tuple[str, str] | None = None,
    idempotency_key: str | None = None,
    registry: Registry | None = None,
    settings: Settings | None = None,
    retry_of_job_id: str | None = None,
    delay: float | timedelta | None = None,
) -> JobRecord:
    """Submit a workflow kind (what :func:`jobs.submit` does for one): its function builds the steps.

    Raises:
      ValueError: The payload does not fit the kind's function, or it built an invalid DAG.
      UnknownKind, IdempotencyConflict: As for :func:`submit_workflow`.
    """
    settings = settings or current_settings()
    request = dict(payload or {})
    try:
        steps = list(kind.fn(WorkflowRequest(owner_id, kind.name, settings), **request))
    except TypeError as exc:  # an unknown or missing field (the web layer checks fields before this)
        raise ValueError(f"the payload does not fit workflow {kind.name!r}: {exc}") from None
    return submit_workflow(
        target,
        owner_id=owner_id,
        name=kind.name,
        steps=steps,
        resource=resource,
        idempotency_key=idempotency_key,
        registry=registry,
        settings=settings,
        retry_of_job_id=retry_of_job_id,
        request=request,
        delay=delay,
        summary=kind.summarize(request),
    )


def extend_workflow(
    tx: Any,
    job_id: str,
    steps: Sequence[Step],
    *,
    registry: Registry | None = None,
    settings: Settings | None = None,
) -> Extension:
    """Add *steps* to the workflow of step *job_id*, inside the transaction that completes that step.

    Call it from the step's ``with ctx.result_transaction() as tx:`` block (pass *tx*, or its
    Session), before ``tx.complete(...)``. The new steps, their edges and the parent's description
    are written in that transaction: they exist iff the step succeeds. New steps may depend on any
    step of the workflow (existing, reused by a retry, or new) — typically on the extending step
    itself, whose success (same commit) then releases them; a new step whose dependencies have all
    succeeded already gets its message at once. The steps take the workflow's config snapshot.

    Parameters:
      tx: The open :class:`~jobs.context.ResultTransaction` (or a Session) of step *job_id*.
      job_id: The extending step (``ctx.job_id``).
      steps: The steps to add; names must be new to the workflow.
      registry: Where the steps' kinds are looked up.

    Raises:
      ValueError: *job_id* is not a workflow step, a name is taken, a dependency is unknown, a cycle.
      UnknownKind: A step's kind is not registered.
      JobCancelled: The workflow is stopping (failed or cancelled): nothing may be added, and the
        step ends cancelled like the workflow's other steps.

    Returns:
      The workflow's id and, by name, every step it has after the extension.
    """
    registry = registry or default_registry
    settings = settings or current_settings()
    session = getattr(tx, "session", tx)
    wtx = db.session_tx(session)
    conn = wtx.conn
    me = store.job_get(conn, job_id)
    parent = None if me is None or me.parent_job_id is None else store.job_get_for_update(conn, me.parent_job_id)
    if parent is None or parent.actor_name != "" or me is None:
        raise ValueError(f"job {job_id} is not a step of a workflow")
    if parent.status != JobStatus.RUNNING or parent.cancel_requested_at is not None:
        raise JobCancelled()
    config = json.loads(parent.config)
    children = store.job_children(conn, parent.id)
    ids: dict[str, str] = {**config.get(REUSED_KEY, {}), **{dag.step_name(c): c.id for c in children}}
    taken = sorted(s.name for s in steps if s.name in ids)
    if taken:
        raise ValueError(f"the workflow already has steps named {', '.join(taken)}")
    if not steps:
        return Extension(parent.id, ids)
    order = [s for s in _check_dag([*steps, *(Step(n, "") for n in ids)]) if s.name not in ids]
    kinds = {s.name: _step_kind(registry, s) for s in order}
    snapshot = {k: v for k, v in config.items() if k != REUSED_KEY}
    now = store.now_ms()
    resource = (parent.resource_type, parent.resource_id) if parent.resource_type is not None else None
    _insert_steps(
        wtx,
        parent_id=parent.id,
        owner_id=parent.owner_id,
        resource=resource,  # type: ignore[arg-type]
        snapshot=snapshot,
        order=order,
        kinds=kinds,
        ids=ids,
        settings=settings,
        registry=registry,
        now=now,
    )
    payload = json.loads(parent.payload)
    payload["steps"] = [*payload.get("steps", []), *(_describe(s) for s in steps)]
    seq = store.job_workflow_extend(conn, parent.id, store.dumps(payload), now)
    assert seq is not None  # the parent is running and locked
    events.record(
        wtx,
        job_id=parent.id,
        sequence=seq,
        type_="workflow_extended",
        data={"by": dag.step_name(me), "steps": [s.name for s in steps]},
        now=now,
    )
    progress = dag.aggregate_progress(store.job_children(conn, parent.id), len(dag.reused_steps(parent)))
    store.job_workflow_progress(conn, parent.id, progress, now)
    return Extension(parent.id, ids)


def workflow_steps(engine: Engine, parent_id: str, *, owner_id: str, is_admin: bool = False) -> list[JobRecord]:
    """The steps of a workflow, in creation order (steps created together in the order they run).

    Raises:
      JobNotFound: No such workflow, or another owner's.
    """
    with db.read(engine) as conn:
        _visible_parent(conn, parent_id, owner_id, is_admin)
        children = store.job_children(conn, parent_id)
        edges = read_store.step_edges(conn, [c.id for c in children])
    return [JobRecord.from_row(c) for c in dag.in_run_order(children, edges)]


def _visible_parent(conn: Any, parent_id: str, owner_id: str, is_admin: bool) -> store.JobRow:
    parent = store.job_get(conn, parent_id)
    if parent is None or (not is_admin and parent.owner_id != owner_id):
        raise JobNotFound()
    return parent


def retry_workflow(
    target: Engine | Session,
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
    with db.read(db.engine_of(target)) as conn:
        parent = _visible_parent(conn, parent_id, by, is_admin)
        children = store.job_children(conn, parent_id)
    if parent.status not in (JobStatus.FAILED, JobStatus.CANCELLED) or not children:
        raise JobNotRetryable(f"workflow {parent_id} is {parent.status}; only failed or cancelled workflows retry")
    if any(not JobStatus(c.status).terminal for c in children):
        raise JobNotRetryable(f"workflow {parent_id} still has running steps; retry once they have stopped")
    payload = json.loads(parent.payload)
    succeeded = {dag.step_name(c): c.id for c in children if c.status == JobStatus.SUCCEEDED}
    previously_reused = json.loads(parent.config).get(REUSED_KEY, {})
    reused = {**previously_reused, **succeeded}
    # The description includes the steps earlier steps added (extend_workflow); a step that did not
    # succeed never added its own, so re-running it adds them again.
    steps = [_step_from(s) for s in payload["steps"] if s["name"] not in reused]
    resource = (parent.resource_type, parent.resource_id) if parent.resource_type is not None else None
    return submit_workflow(
        target,
        owner_id=parent.owner_id,
        name=parent.kind,
        steps=steps,
        resource=resource,  # type: ignore[arg-type]
        registry=registry,
        settings=settings,
        idempotency_key=retry_key(parent.id),  # retried once, as a single job (jobs.control.retry)
        retry_of_job_id=parent.id,
        reused=reused,
        request=payload.get("request"),
        summary=parent.summary,
    )


def workflow_graph(engine: Engine, parent_id: str, *, owner_id: str, is_admin: bool = False) -> dict[str, StepView]:
    """The DAG of a workflow: step name → its job, the names it depends on, and whether it was reused.

    Reused steps (a retry's succeeded steps of the workflow it retries) are included, so the graph is
    the whole workflow as this parent runs it.

    Raises:
      JobNotFound: No such workflow, or another owner's.
    """
    with db.read(engine) as conn:
        parent = _visible_parent(conn, parent_id, owner_id, is_admin)
        children = store.job_children(conn, parent_id)
        reused = json.loads(parent.config).get(REUSED_KEY, {})
        rows = {c.id: c for c in children}
        for job_id in reused.values():
            row = store.job_get(conn, job_id)
            if row is not None:
                rows[row.id] = row
        edges = store.dependency_list(conn, parent_id) + store.dependency_list_of_jobs(conn, list(reused.values()))
    names = {**{job_id: name for name, job_id in reused.items()}, **{c.id: dag.step_name(c) for c in children}}
    after: dict[str, list[str]] = {}
    for job_id, dep in edges:
        after.setdefault(job_id, []).append(names.get(dep, dep))
    reused_ids = set(reused.values())
    return {
        names[job_id]: StepView(
            names[job_id], JobRecord.from_row(row), tuple(sorted(after.get(job_id, ()))), job_id in reused_ids
        )
        for job_id, row in rows.items()
    }
