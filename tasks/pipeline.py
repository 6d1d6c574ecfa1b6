"""``recording_pipeline``: import → transcribe every segment (fan-out) → render a highlight (fan-in) → notify.

Payload: ``{"folder", "channels"?: [names], "start_s"?, "end_s"?, "highlight_s"?: 20, "danmaku"?: true,
"width"?: 1280, "height"?: 720}``.
Without a window the highlight is ``highlight_s`` seconds around the middle of the session (so it
usually crosses a segment boundary). Result: ``{"session_id", "clip", "steps": {name: {"job_id",
"kind", "depends_on", "reused", "status"}}}`` — the DAG, also kept in ``pipeline_steps`` and visible
in the job records (every step is a job whose ``parent_job_id`` is the pipeline).

How it runs (until the job layer has workflows, see docs/actors.md): the pipeline job is a
supervisor on its own queue. It submits each step as a child job once the steps it depends on
succeeded, waits, and reports the aggregate of its steps' progress. Fail-fast: the first step that
ends failed, cancelled or interrupted cancels every unfinished step and fails the pipeline.
Cancelling the pipeline cancels its steps. A manual retry of a failed pipeline (a new job with
``retry_of_job_id``) reuses the steps that succeeded and re-runs only the failed/cancelled ones.
Safe to re-run: steps are submitted with an idempotency key per (pipeline, step), so a supervisor
restarted after a crash re-attaches to the steps it had already started.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from jobs import JobCancelled, JobContext, JobRecord, JobStatus, cancel, get_job, registry, submit

from . import import_recording, notify, render_clip, store, transcribe  # noqa: F401  (the step kinds)
from .domain.control import DomainError
from .runtime import domain_engine

#: Queue of the pipeline supervisors (never shared with their steps, which would wait for a free thread).
QUEUE = "pipelines"
#: How often the supervisor looks at its steps, in seconds.
POLL_INTERVAL_S = 0.3
#: How long fail-fast waits for cancelled steps to stop, in seconds.
SETTLE_TIMEOUT_S = 30.0
#: Highlight length when the payload gives no window, in seconds.
DEFAULT_HIGHLIGHT_S = 20.0
#: Share of the pipeline's progress bar per stage (import, transcribe, render, notify).
STAGES = {"import": (0.0, 0.15), "transcribe": (0.15, 0.6), "render": (0.6, 0.95), "notify": (0.95, 1.0)}
_FAILED = frozenset({JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.INTERRUPTED})


class PipelineFailed(DomainError):
    """A step of the pipeline failed; the remaining steps were cancelled."""


@dataclass
class _Step:
    name: str
    kind: str
    job_id: str
    depends_on: tuple[str, ...]
    reused: bool
    record: JobRecord | None = None


class _Supervisor:
    """Submits steps, waits for them, aggregates their progress, fails fast."""

    def __init__(self, ctx: JobContext, engine: Engine) -> None:
        self.ctx = ctx
        self.engine = engine
        self.steps: dict[str, _Step] = {}
        with engine.connect() as conn:
            mine = store.pipeline_step_list(conn, ctx.job_id)
        for row in mine:  # a restarted supervisor re-attaches to what it started
            self.steps[row.step] = _Step(row.step, row.kind, row.job_id, row.depends_on, row.reused)
        self.previous: dict[str, str] = {}
        retry_of = self._job(ctx.job_id).retry_of_job_id
        if retry_of is not None:
            with engine.connect() as conn:
                old = store.pipeline_step_list(conn, retry_of)
            self.previous = {r.step: r.job_id for r in old if self._job(r.job_id).status == JobStatus.SUCCEEDED}

    def _job(self, job_id: str) -> JobRecord:
        return get_job(self.engine, job_id, owner_id=self.ctx.owner_id)

    def step(self, name: str, kind: str, payload: dict[str, Any], depends_on: Sequence[str]) -> _Step:
        """Start *name* (or re-attach to it, or reuse a succeeded step of the pipeline this one retries)."""
        if name in self.steps:
            return self.steps[name]
        reused_id = self.previous.get(name)
        with Session(self.engine) as session, session.begin():
            if reused_id is None:
                record = submit(
                    session,
                    owner_id=self.ctx.owner_id,
                    kind=kind,
                    payload=payload,
                    idempotency_key=f"{self.ctx.job_id}:{name}",
                    parent_job_id=self.ctx.job_id,
                    resource=("recording_pipeline", self.ctx.job_id),
                )
                job_id = record.id
            else:
                job_id = reused_id
            store.pipeline_step_insert(
                session.connection(),
                pipeline_job_id=self.ctx.job_id,
                step=name,
                job_id=job_id,
                kind=kind,
                depends_on=list(depends_on),
                reused=reused_id is not None,
            )
        step = self.steps[name] = _Step(name, kind, job_id, tuple(depends_on), reused_id is not None)
        self.ctx.event(
            "step_started" if reused_id is None else "step_reused",
            step=name,
            kind=kind,
            job_id=job_id,
            depends_on=list(depends_on),
        )
        return step

    def wait(self, names: Sequence[str], stage: str) -> dict[str, JobRecord]:
        """Wait until every named step succeeded; fail fast on the first that did not.

        Raises:
          PipelineFailed: A step failed, was cancelled or interrupted (the others were cancelled).
          JobCancelled: The pipeline was cancelled (its steps were cancelled too).
        """
        lo, hi = STAGES[stage]
        last_progress = -1.0
        while True:
            try:
                self.ctx.check_cancelled()
            except JobCancelled:
                self.cancel_unfinished("pipeline cancelled")
                raise
            records = {n: self._job(self.steps[n].job_id) for n in names}
            for n, record in records.items():
                self.steps[n].record = record
                if record.status in _FAILED:
                    self.cancel_unfinished(f"step {n} {record.status}")
                    self.ctx.event("step_failed", step=n, job_id=record.id, status=record.status, error=record.error)
                    raise PipelineFailed(f"step {n} {record.status}: {record.error or 'no error recorded'}")
            done = [r.status == JobStatus.SUCCEEDED for r in records.values()]
            fraction = sum(1.0 if ok else (r.progress or 0.0) for ok, r in zip(done, records.values(), strict=True))
            overall = lo + (hi - lo) * fraction / max(1, len(records))
            if overall - last_progress >= 0.01 or all(done):
                last_progress = overall
                finished = sum(done)
                self.ctx.progress(round(overall, 4), f"{stage}: {finished}/{len(records)} step(s) done")
            if all(done):
                return records
            time.sleep(POLL_INTERVAL_S)

    def cancel_unfinished(self, why: str) -> None:
        """Cancel every step that has not finished (fail-fast, or the pipeline was cancelled).

        A running step stops at its next checkpoint; this waits (up to :data:`SETTLE_TIMEOUT_S`) until
        every step is final, so that the pipeline's own final status means "nothing of it still runs"
        and a retry sees which steps really succeeded.
        """
        pending = []
        for step in self.steps.values():
            if step.reused:
                continue
            result = cancel(self.engine, step.job_id, by=self.ctx.owner_id)
            if result.outcome.value in ("cancelled", "requested"):
                self.ctx.event("step_cancelled", step=step.name, job_id=step.job_id, why=why)
            if result.outcome.value in ("requested", "already_requested"):
                pending.append(step.job_id)
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while pending and time.monotonic() < deadline:
            pending = [job_id for job_id in pending if not self._job(job_id).terminal]
            if pending:
                time.sleep(POLL_INTERVAL_S)

    def dag(self) -> dict[str, Any]:
        out = {}
        for name, step in self.steps.items():
            status = (step.record or self._job(step.job_id)).status
            out[name] = {
                "job_id": step.job_id,
                "kind": step.kind,
                "depends_on": list(step.depends_on),
                "reused": step.reused,
                "status": str(status),
            }
        return out


def highlight_window(duration_s: float, start_s: float | None, end_s: float | None, highlight_s: float) -> tuple:
    """The clip window: the payload's, else ``highlight_s`` around the middle of the session."""
    if start_s is not None and end_s is not None:
        return float(start_s), float(end_s)
    length = min(highlight_s, duration_s)
    start = max(0.0, duration_s / 2 - length / 2)
    return round(start, 3), round(min(duration_s, start + length), 3)


@registry.kind("recording_pipeline", queue=QUEUE, safe_to_rerun=True, never_retry=(PipelineFailed,), timeout_s=3600)
def recording_pipeline(
    ctx: JobContext,
    *,
    folder: str,
    channels: Sequence[str] = (),
    start_s: float | None = None,
    end_s: float | None = None,
    highlight_s: float = DEFAULT_HIGHLIGHT_S,
    danmaku: bool = True,
    width: int = 1280,
    height: int = 720,
) -> Any:
    """Run the recording pipeline on *folder*.

    Raises:
      PipelineFailed: A step failed (fail-fast; retry the pipeline to re-run only the failed steps).
    """
    sup = _Supervisor(ctx, domain_engine())
    sup.step("import", "import_recording", {"folder": folder}, [])
    imported = sup.wait(["import"], "import")["import"].result
    session_id = imported["session_id"]
    names = []
    for seg in imported["segments"]:
        name = f"transcribe-{seg['index']}"
        sup.step(name, "transcribe", {"session_id": session_id, "segment": seg["index"]}, ["import"])
        names.append(name)
    sup.wait(names, "transcribe")
    start, end = highlight_window(imported["duration_s"], start_s, end_s, highlight_s)
    render_payload = {
        "session_id": session_id,
        "start_s": start,
        "end_s": end,
        "subtitles": True,
        "danmaku": danmaku,
        "thumbnail": True,
        "width": width,
        "height": height,
        "name": "highlight",
    }
    sup.step("render", "render_clip", render_payload, names)
    clip = sup.wait(["render"], "render")["render"].result
    notify_names = []
    for channel_name in channels:
        kind, payload = notify.notification_request(
            channel_name,
            "recording.highlight_ready",
            {
                "pipeline_job_id": ctx.job_id,
                "session_id": session_id,
                "clip_id": clip["clip_id"],
                "title": imported["title"],
            },
        )
        name = f"notify-{channel_name}"
        sup.step(name, kind, payload, ["render"])
        notify_names.append(name)
    if notify_names:
        sup.wait(notify_names, "notify")
    result = {"session_id": session_id, "clip": clip, "steps": sup.dag()}
    with ctx.result_transaction() as tx:
        tx.complete(result)
    return result
