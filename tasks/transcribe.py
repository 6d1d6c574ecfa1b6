"""``transcribe``: ASR of one segment (or a range of it) → a stored transcript and an SRT file.

Payload: ``{"session_id", "segment": index, "start_s"?: float, "end_s"?: float, "language"?: "en"}``
(times are seconds of the segment). Result: ``{"transcript_id", "session_id", "segment", "start_s",
"end_s", "language", "cues", "text", "srt"}`` where ``srt`` is this attempt's file.

Runs on its own queue (:data:`QUEUE`), served by its own worker process type with one thread (the
model takes ~480 MB and both cores): ``dramatiq tasks:compose --processes 1 --threads 1 --queues asr``. The
model is loaded once per process on first use and released when the worker shuts down
(:class:`AsrModelMiddleware`). Safe to re-run: it reads the segment and writes a per-attempt file
plus an upserted row.
"""

from __future__ import annotations

import logging
from typing import Any

from dramatiq.broker import Broker
from dramatiq.middleware import Middleware

from jobs import JobCancelled, JobContext, payloads, registry

from . import store
from .domain.asr.audio import NoAudio
from .domain.asr.model import MODELS, ModelConfig, ModelUnavailable
from .domain.asr.transcribe import transcribe
from .domain.control import Cancelled, DomainError
from .output_gate import gated_write
from .runtime import Reporter, domain_engine, hinted_backoff, task_settings

logger = logging.getLogger(__name__)

#: The ASR queue (its own worker process type, concurrency 1).
QUEUE = "asr"


class SegmentNotFound(DomainError):
    """The session or segment does not exist."""


class AsrModelMiddleware(Middleware):
    """Releases the process's ASR model when the worker shuts down (it is loaded on first use)."""

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        if len(MODELS):
            MODELS.release()
            logger.info("ASR model released (%d load(s) in this process).", MODELS.loads)


def install(broker: Broker) -> None:
    """Add :class:`AsrModelMiddleware` to *broker* once."""
    if not any(isinstance(m, AsrModelMiddleware) for m in broker.middleware):
        broker.add_middleware(AsrModelMiddleware())


def model_config() -> ModelConfig:
    s = task_settings()
    return ModelConfig(source=s.asr_model, cpu_threads=s.asr_threads, allow_download=s.asr_allow_download)


PAYLOAD = payloads.schema(
    "Transcribe a segment",
    "Speech recognition of one segment of an imported session (or a range of it) into a transcript and SRT.",
    session_id=payloads.field("string", "Session", "The session (an import's result).", required=True, max_length=64),
    segment=payloads.field(
        "integer", "Segment", "Which segment of the session (0 is the first).", minimum=0, required=True
    ),
    start_s=payloads.field("number", "From", "Start within the segment.", unit="s", minimum=0, default=0.0),
    end_s=payloads.field(
        "number",
        "To",
        "End within the segment (empty: its end).",
        unit="s",
        minimum=0,
        nullable=True,
        after="start_s",
    ),
    language=payloads.field(
        "string", "Language", "The spoken language (empty: detect it).", default="en", max_length=16, nullable=True
    ),
)


@registry.kind(
    "transcribe",
    queue=QUEUE,
    payload=PAYLOAD,
    summary=lambda p: f"{p['session_id']} segment {p['segment']}",
    safe_to_rerun=True,
    backoff=hinted_backoff,
    never_retry=(SegmentNotFound, NoAudio, ModelUnavailable, FileNotFoundError),
)
def transcribe_job(
    ctx: JobContext,
    *,
    session_id: str,
    segment: int,
    start_s: float = 0.0,
    end_s: float | None = None,
    language: str | None = "en",
) -> Any:
    """Transcribe a segment of an imported session.

    Raises:
      SegmentNotFound: No such session/segment.
      FileNotFoundError: The segment's file is gone.
    """
    with domain_engine().connect() as conn:
        segments = store.segment_list(conn, session_id, owner_id=ctx.owner_id)
    seg = next((s for s in segments if s.idx == segment), None)
    if seg is None:
        raise SegmentNotFound(f"session {session_id} has no segment {segment}")
    if not seg.path.is_file():
        raise FileNotFoundError(f"segment file {seg.path.name} is missing")
    # Checked after every decoded segment, unthrottled: a cancel takes effect within one segment.
    reporter = Reporter(ctx, 0.0, 0.97, poll_interval_s=0.0)
    try:
        transcript = transcribe(
            seg.path,
            start_s=start_s,
            end_s=end_s,
            model_config=model_config(),
            language=language,
            progress=reporter.progress,
            should_stop=reporter.should_stop,
        )
    except Cancelled as exc:
        if isinstance(reporter.stop_reason, JobCancelled):
            ctx.event("transcription_stopped", segments_done=getattr(exc, "segments_done", 0))
        reporter.reraise()
        raise JobCancelled() from None
    with gated_write(ctx):
        srt = ctx.output_path(f"segment-{segment}.srt")
        srt.write_text(transcript.srt(), encoding="utf-8")
    cues = [{"start_s": round(s.start_s, 3), "end_s": round(s.end_s, 3), "text": s.text} for s in transcript.segments]
    end = transcript.end_s
    with ctx.result_transaction() as tx:
        transcript_id = store.transcript_upsert(
            tx.connection,
            session_id=session_id,
            segment_idx=segment,
            start_ms=round(start_s * 1000),
            end_ms=round(end * 1000) if end_s is not None else round(seg.duration_s * 1000),
            language=transcript.language,
            text=transcript.text,
            cues=cues,
            srt_path=str(srt),
            job_id=ctx.job_id,
        )
        result = {
            "transcript_id": transcript_id,
            "session_id": session_id,
            "segment": segment,
            "start_s": start_s,
            "end_s": round(end, 3),
            "language": transcript.language,
            "cues": len(cues),
            "text": transcript.text[:2000],
            "srt": str(srt),
        }
        tx.complete(result)
    return result
