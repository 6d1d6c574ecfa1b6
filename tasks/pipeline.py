"""``recording_pipeline``: import → transcribe every segment (fan-out) → render a highlight (fan-in) → notify.

Payload: ``{"folder", "channels"?: [names], "start_s"?, "end_s"?, "highlight_s"?: 20, "danmaku"?: true,
"width"?: 1280, "height"?: 720}``. Without a window the highlight is ``highlight_s`` seconds around
the middle of the session (so it usually crosses a segment boundary).

A workflow of the job layer (:mod:`jobs.workflows`), declared as a workflow kind: submitting it
from the API, the UI or Python creates the workflow parent (kind ``recording_pipeline``) with one
step, ``import``. The rest of the DAG is only known as it runs, so steps extend it as they complete,
inside their own ``result_transaction`` (:func:`jobs.extend_workflow`):

- ``import`` (``import_recording``) adds ``transcribe-<n>`` for every segment it imported (each
  after ``import``) and ``render`` (``render_clip``, after every transcribe; the window computed
  from the session's real duration). Its commit records the session, its success, the new steps
  and — the readiness being decided in that same transaction — the transcribes' messages.
- ``render`` adds ``notify-<channel>`` (after ``render``), each carrying the clip it rendered.

A step knows it is a pipeline step by the plan in its config (:data:`PLAN_KEY`, set by whoever
added it), so the same kinds run alone unchanged. The job layer does the rest: fail-fast (a step
that fails cancels the others and fails the pipeline, naming it), cancel, a retry that re-runs only
the steps that did not succeed (the parent's payload describes every step added), and the parent's
progress (the mean of its steps'). The DAG is in the job records: every step has the pipeline as
``parent_job_id``; edges are ``job_dependencies`` rows (:func:`jobs.workflow_graph`). The parent's
result is ``{"steps": {name: job_id}}``; the clip is the ``render`` step's result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jobs import JobContext, Step, WorkflowRequest, extend_workflow, payloads, registry

from .channels import ChannelError
from .domain.control import DomainError
from .notify import notification_request

#: The workflow kind (the name users submit and lists show).
KIND = "recording_pipeline"
#: Config key of a pipeline step: what it adds to the workflow when it completes.
PLAN_KEY = "recording_pipeline"
#: Highlight length when the payload gives no window, in seconds.
DEFAULT_HIGHLIGHT_S = 20.0
#: Event type of the notifications.
EVENT_TYPE = "recording.highlight_ready"


class PipelineError(DomainError):
    """The pipeline cannot go on as asked (an unknown channel); re-running the step would not help."""


def highlight_window(duration_s: float, start_s: float | None, end_s: float | None, highlight_s: float) -> tuple:
    """The clip window: the payload's, else ``highlight_s`` around the middle of the session."""
    if start_s is not None and end_s is not None:
        return float(start_s), float(end_s)
    length = min(highlight_s, duration_s)
    start = max(0.0, duration_s / 2 - length / 2)
    return round(start, 3), round(min(duration_s, start + length), 3)


def _window_check(payload: dict[str, Any]) -> dict[str, str]:
    if (payload.get("start_s") is None) != (payload.get("end_s") is None):
        return {"end_s": "Give both a start and an end, or neither."}
    return {}


PAYLOAD = payloads.schema(
    "Recording pipeline",
    "Import a folder, transcribe every segment, render a highlight with subtitles, notify the channels.",
    folder=payloads.field(
        "string",
        "Folder",
        "A recording folder under an import root, or one of your uploads (upload:<id>).",
        required=True,
        max_length=4096,
    ),
    channels=payloads.field("list", "Notify", "Notification channels to tell when the clip is ready, one per line."),
    start_s=payloads.field(
        "number",
        "Clip start",
        "Where the highlight starts (empty: around the middle).",
        unit="s",
        minimum=0,
        nullable=True,
    ),
    end_s=payloads.field(
        "number",
        "Clip end",
        "Where the highlight ends.",
        unit="s",
        exclusive_minimum=0,
        nullable=True,
        after="start_s",
    ),
    highlight_s=payloads.field(
        "number",
        "Highlight length",
        "Length of the highlight when no window is given.",
        unit="s",
        exclusive_minimum=0,
        default=DEFAULT_HIGHLIGHT_S,
    ),
    danmaku=payloads.field("boolean", "Danmaku", "Overlay the live comments on the clip.", default=True),
    width=payloads.field("integer", "Width", "Width of the clip.", unit="px", minimum=16, maximum=7680, default=1280),
    height=payloads.field("integer", "Height", "Height of the clip.", unit="px", minimum=16, maximum=4320, default=720),
    check=_window_check,
    rules=("give both a clip start and a clip end, or neither.",),
)


@registry.workflow(KIND, payload=PAYLOAD, summary=lambda p: str(p["folder"]))
def recording_pipeline(
    request: WorkflowRequest,
    *,
    folder: str,
    channels: Sequence[str] = (),
    start_s: float | None = None,
    end_s: float | None = None,
    highlight_s: float = DEFAULT_HIGHLIGHT_S,
    danmaku: bool = True,
    width: int = 1280,
    height: int = 720,
) -> list[Step]:
    """Run the whole recording pipeline on a folder.

    Import it, transcribe every segment, render a highlight with subtitles and a thumbnail, and
    notify the channels. The payload schema refuses a window or size that cannot be rendered before
    anything is written; :func:`check_plan` checks the plan again (and the channels, which only a
    worker knows) when the import step starts.
    """
    plan = {
        "channels": list(channels),
        "start_s": start_s,
        "end_s": end_s,
        "highlight_s": float(highlight_s),
        "danmaku": bool(danmaku),
        "width": int(width),
        "height": int(height),
    }
    return [Step("import", "import_recording", {"folder": folder}, config={PLAN_KEY: plan})]


def check_plan(ctx: JobContext) -> None:
    """Refuse a pipeline plan that cannot be rendered, before the import step does any work.

    Raises:
      PipelineError: Half a window, a window outside ``0 <= start_s < end_s``, or a size or
        highlight length that is not positive.
    """
    plan = _plan(ctx)
    if plan is None:
        return
    start_s, end_s = plan.get("start_s"), plan.get("end_s")
    if (start_s is None) != (end_s is None):
        raise PipelineError("give both start_s and end_s, or neither")
    if start_s is not None and end_s is not None and not 0 <= start_s < end_s:
        raise PipelineError("the window must satisfy 0 <= start_s < end_s")
    if plan["highlight_s"] <= 0 or plan["width"] <= 0 or plan["height"] <= 0:
        raise PipelineError("highlight_s, width and height must be positive")
    _check_channels(plan.get("channels") or ())


def _plan(ctx: JobContext) -> Mapping[str, Any] | None:
    plan = ctx.config.get(PLAN_KEY)
    return plan if isinstance(plan, Mapping) else None


def _check_channels(channels: Sequence[str]) -> None:
    for name in channels:
        try:
            notification_request(name, EVENT_TYPE, {})
        except ChannelError as exc:
            raise PipelineError(f"notification channel {name!r}: {exc}") from None


def extend_after_import(ctx: JobContext, tx: Any, imported: Mapping[str, Any]) -> None:
    """When the import runs as a pipeline step: add transcribe×N → render, in its result transaction.

    Call inside ``with ctx.result_transaction() as tx:`` before ``tx.complete``; does nothing for an
    import that is no pipeline step.

    Raises:
      PipelineError: A notification channel of the plan does not exist (checked now, before any
        transcription runs, rather than after the render).
    """
    plan = _plan(ctx)
    if plan is None:
        return
    _check_channels(plan.get("channels") or ())
    me = str(ctx.config.get("workflow_step", "import"))
    session_id = imported["session_id"]
    transcribes = [
        Step(f"transcribe-{seg['index']}", "transcribe", {"session_id": session_id, "segment": seg["index"]}, [me])
        for seg in imported["segments"]
    ]
    start, end = highlight_window(imported["duration_s"], plan.get("start_s"), plan.get("end_s"), plan["highlight_s"])
    render = Step(
        "render",
        "render_clip",
        {
            "session_id": session_id,
            "start_s": start,
            "end_s": end,
            "subtitles": True,
            "danmaku": bool(plan.get("danmaku", True)),
            "thumbnail": True,
            "width": int(plan.get("width", 1280)),
            "height": int(plan.get("height", 720)),
            "name": "highlight",
        },
        [t.name for t in transcribes],
        config={PLAN_KEY: {"channels": list(plan.get("channels") or ()), "title": imported.get("title")}},
    )
    extend_workflow(tx, ctx.job_id, [*transcribes, render])


def extend_after_render(ctx: JobContext, tx: Any, clip: Mapping[str, Any]) -> None:
    """When the render runs as a pipeline step: add one notify step per channel, carrying the clip.

    Call inside ``with ctx.result_transaction() as tx:`` before ``tx.complete``; does nothing for a
    render that is no pipeline step, or a pipeline without channels.

    Raises:
      PipelineError: A channel no longer exists.
    """
    plan = _plan(ctx)
    channels = list((plan or {}).get("channels") or ())
    if plan is None or not channels:
        return
    _check_channels(channels)
    me = str(ctx.config.get("workflow_step", "render"))
    # The workflow's id is known only here (the steps were planned before it existed): add nothing,
    # read it, then build the notifications.
    pipeline_id = extend_workflow(tx, ctx.job_id, []).parent_id
    data = {
        "pipeline_job_id": pipeline_id,
        "session_id": clip["session_id"],
        "clip_id": clip["clip_id"],
        "title": plan.get("title"),
        "start_s": clip["start_s"],
        "end_s": clip["end_s"],
        "duration_s": clip["duration_s"],
    }
    notifies = []
    for name in channels:
        kind, payload = notification_request(name, EVENT_TYPE, data)
        notifies.append(Step(f"notify-{name}", kind, payload, [me]))
    extend_workflow(tx, ctx.job_id, notifies)
