"""``render_clip``: cut a window of a session into an MP4 with optional subtitles, danmaku and a thumbnail.

Payload: ``{"session_id", "start_s", "end_s", "subtitles"?: true, "danmaku"?: false, "thumbnail"?: true,
"width"?: 1280, "height"?: 720, "name"?: "clip"}`` (times on the session timeline, which runs across
segment boundaries). Result: ``{"clip_id", "session_id", "start_s", "end_s", "path", "thumbnail",
"duration_s", "size_bytes", "subtitle_cues", "danmaku_comments"}``.

Files are per attempt (``<output_root>/<job>/<attempt>-<name>.mp4``): a retry never overwrites an
earlier attempt's file, a failed or cancelled attempt removes what it declared (the job layer) and
ffmpeg's scratch directory (the renderer), and the clip row is written with the job's result, so a
published result names only files that exist. Cancellation kills ffmpeg's process group; a worker
killed mid-render takes ffmpeg with it (parent-death signal) and leaves a scratch directory that the
resync removes (:func:`tasks.outputs.clean_partial_outputs`). Safe to re-run.

As a step of a recording pipeline it also adds the pipeline's notifications (one per channel,
carrying the clip) in its result transaction (:mod:`tasks.pipeline`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobs import JobCancelled, JobContext, payloads, registry

from . import store
from .domain.control import Cancelled, DomainError
from .domain.media.render import RenderError, RenderOptions, render_clip
from .domain.media.subtitles import Cue
from .output_gate import gated_write
from .pipeline import PipelineError, extend_after_render
from .runtime import Reporter, domain_engine, hinted_backoff, task_settings

#: Queue of the render kind.
QUEUE = "render"


class SessionNotFound(DomainError):
    """No such recording session."""


def session_cues(session_id: str, owner_id: str) -> list[Cue]:
    """The stored transcripts of a session as cues on the session timeline."""
    with domain_engine().connect() as conn:
        offsets = {s.idx: s.offset_s for s in store.segment_list(conn, session_id, owner_id=owner_id)}
        transcripts = store.transcript_list(conn, session_id)
    cues = []
    for t in transcripts:
        offset = offsets.get(t.segment_idx)
        if offset is None:
            continue
        cues += [Cue(c["start_s"] + offset, c["end_s"] + offset, c["text"]) for c in t.cues]
    cues.sort(key=lambda c: c.start_s)
    return cues


PAYLOAD = payloads.schema(
    "Render a clip",
    "Cut a window of an imported session into an MP4, with subtitles, danmaku and a thumbnail if asked.",
    session_id=payloads.field(
        "string", "Session", "The session to cut (an import's result).", required=True, max_length=64
    ),
    start_s=payloads.field(
        "number", "Start", "Where the clip starts on the session's timeline.", unit="s", minimum=0, required=True
    ),
    end_s=payloads.field(
        "number",
        "End",
        "Where the clip ends (after the start).",
        unit="s",
        exclusive_minimum=0,
        required=True,
        after="start_s",
    ),
    subtitles=payloads.field("boolean", "Subtitles", "Burn in the session's transcripts.", default=True),
    danmaku=payloads.field("boolean", "Danmaku", "Overlay the live comments.", default=False),
    thumbnail=payloads.field("boolean", "Thumbnail", "Also write a JPEG of the first frame.", default=True),
    width=payloads.field("integer", "Width", "Width of the clip.", unit="px", minimum=16, maximum=7680, default=1280),
    height=payloads.field("integer", "Height", "Height of the clip.", unit="px", minimum=16, maximum=4320, default=720),
    name=payloads.field(
        "string", "File name", "Name of the clip's file (without .mp4).", default="clip", max_length=100
    ),
)


def _summary(payload: dict[str, Any]) -> str:
    return f"{payload['session_id']} {payload['start_s']:g}–{payload['end_s']:g} s"


@registry.kind(
    "render_clip",
    queue=QUEUE,
    payload=PAYLOAD,
    summary=_summary,
    safe_to_rerun=True,
    backoff=hinted_backoff,
    never_retry=(SessionNotFound, RenderError, FileNotFoundError, PipelineError),
)
def render_clip_job(
    ctx: JobContext,
    *,
    session_id: str,
    start_s: float,
    end_s: float,
    subtitles: bool = True,
    danmaku: bool = False,
    thumbnail: bool = True,
    width: int = 1280,
    height: int = 720,
    name: str = "clip",
) -> Any:
    """Render ``[start_s, end_s)`` of a session.

    Raises:
      SessionNotFound: No such session.
      RenderError: A window outside the session.
      OutputRootDegraded: The output root is degraded (retried after the next probe is due).
    """
    with domain_engine().connect() as conn:
        segments = store.segment_list(conn, session_id, owner_id=ctx.owner_id)
    if not segments:
        raise SessionNotFound(f"no recording session {session_id}")
    cues = session_cues(session_id, ctx.owner_id) if subtitles else None
    settings = task_settings()
    options = RenderOptions(
        width=width,
        height=height,
        fonts_dir=Path(settings.fonts_dir) if settings.fonts_dir else None,
        timeout_s=float(ctx.timeout_s),
    )
    reporter = Reporter(ctx, 0.0, 0.99)

    def ffmpeg_started(pid: int) -> None:
        ctx.event("ffmpeg_started", pid=pid)

    with gated_write(ctx):
        # Declaring the outputs creates the job's directory: a write the gate must see too.
        output = ctx.output_path(f"{name}.mp4")
        thumb = ctx.output_path(f"{name}.jpg") if thumbnail else None
        try:
            rendered = render_clip(
                segments,
                start_s,
                end_s,
                output,
                thumbnail=thumb,
                subtitles=cues,
                danmaku=danmaku,
                options=options,
                progress=reporter.progress,
                should_stop=reporter.should_stop,
                ffmpeg=settings.ffmpeg,
                on_ffmpeg_start=ffmpeg_started,
            )
        except Cancelled:
            reporter.reraise()
            raise JobCancelled() from None
    with ctx.result_transaction() as tx:
        values = {
            "session_id": session_id,
            "start_s": float(start_s),
            "end_s": float(end_s),
            "path": str(rendered.output),
            "thumbnail_path": str(rendered.thumbnail) if rendered.thumbnail else None,
            "duration_s": round(rendered.duration_s, 3),
            "size_bytes": rendered.size_bytes,
            "subtitle_cues": rendered.subtitle_cues,
            "danmaku_comments": rendered.danmaku_comments,
        }
        clip_id = store.clip_insert(tx.connection, job_id=ctx.job_id, attempt=ctx.attempt, **values)
        result = {k: v for k, v in values.items() if k != "thumbnail_path"}
        result.update(clip_id=clip_id, thumbnail=values["thumbnail_path"])
        extend_after_render(ctx, tx, result)  # a pipeline step: its notifications commit with its result
        tx.complete(result)
    return result
