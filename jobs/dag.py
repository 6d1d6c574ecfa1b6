"""What a workflow's rows say about it: step names, reused steps and progress (no writes).

A workflow parent's steps are jobs with ``parent_job_id``; a step's name is kept in its config
snapshot (:data:`STEP_KEY`), and a retried workflow's parent lists the succeeded steps it reuses from
the workflow it retries (:data:`REUSED_KEY`). Both :mod:`jobs.transitions` (which moves a workflow on
when a step finishes) and :mod:`jobs.workflows` (which builds and shows workflows) read them here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from . import store
from .status import TERMINAL_STATUSES

#: Config key naming a step inside its workflow.
STEP_KEY = "workflow_step"
#: Config key of a retried workflow: steps reused from the workflow it retries (name → job id).
REUSED_KEY = "workflow_reused_steps"


def step_name(row: store.JobRow) -> str:
    """A step's name in its workflow (its id for a job that is no named step)."""
    return json.loads(row.config).get(STEP_KEY, row.id)


def reused_steps(parent: store.JobRow) -> dict[str, str]:
    """Steps a retried workflow reuses: name → id of the succeeded step of the workflow it retries."""
    return reused_in(parent.config)


def reused_in(config: str) -> dict[str, str]:
    """:func:`reused_steps` of a parent's config snapshot (its JSON text)."""
    return dict(json.loads(config).get(REUSED_KEY, {}))


def in_run_order(rows: Sequence[store.JobRow], edges: Sequence[tuple[str, str]]) -> list[store.JobRow]:
    """Steps oldest first, and steps created together — in the same millisecond, as a workflow's first
    steps are — in the order they run: after the steps they depend on (*edges*: ``(step, dependency)``)."""
    after: dict[str, list[str]] = {}
    for step, dependency in edges:
        after.setdefault(step, []).append(dependency)
    depth: dict[str, int] = {}

    def depth_of(step: str) -> int:  # the longest chain of dependencies before *step* (a DAG: no cycles)
        if step not in depth:
            depth[step] = 1 + max((depth_of(d) for d in after.get(step, ())), default=-1)
        return depth[step]

    return sorted(rows, key=lambda r: (r.created_at, depth_of(r.id), r.id))


class Progressing(Protocol):
    """A step as its workflow's progress sees it (a job row, or :class:`jobs.store.StepProgress`)."""

    @property
    def status(self) -> str: ...
    @property
    def progress(self) -> float | None: ...


def aggregate_progress(children: Sequence[Progressing], reused: int = 0) -> float:
    """The mean of the steps' progress, a finished step counting 1, and so does each of the *reused*
    steps a retry took over from the workflow it retries (they are part of this run, done already)."""
    if not children and not reused:
        return 0.0
    total = sum(1.0 if c.status in TERMINAL_STATUSES else min(1.0, max(0.0, c.progress or 0.0)) for c in children)
    return round((total + reused) / (len(children) + reused), 4)


def lock_workflow_of_step(conn: Any, parent_id: str | None) -> int | None:
    """Before a step's progress write: lock its running workflow parent (the same order as
    :func:`jobs.transitions._step_finished`: parent first, then the step) and return how many steps it
    reuses; None when the job is no step of a running workflow."""
    if parent_id is None:
        return None
    config = store.job_workflow_config_for_update(conn, parent_id)
    return None if config is None else len(reused_in(config))


def step_progressed(conn: Any, parent_id: str, reused: int, now: int) -> None:
    """After a step's progress write (parent locked by :func:`lock_workflow_of_step`): the workflow's
    progress follows, the mean of its steps' — so it moves while a long step runs. (No status moves:
    this is not a transition.)"""
    progress = aggregate_progress(store.job_children_progress(conn, parent_id), reused)
    store.job_workflow_progress(conn, parent_id, progress, now)
