"""``import_recording``: probe a recording folder and store its session, segments and danmaku stats.

Payload: ``{"folder": "/path/to/recording"}`` (or ``{"files": [...segment paths...]}`` for an upload).
Result: ``{"session_id", "created", "room_id", "title", "duration_s", "segments": [...], "danmaku": {...},
"warnings": [...]}``. Safe to re-run: it only reads the recording and upserts the session by its
recorder key, so a re-import (or a retry after a crash) gives the same session.

As the first step of a recording pipeline it also adds the pipeline's next steps (a transcribe per
imported segment, then the highlight render) in the same transaction (:mod:`tasks.pipeline`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from jobs import JobCancelled, JobContext, payloads, registry

from . import store
from .domain.control import Cancelled
from .domain.recording.danmaku import HostileXml
from .domain.recording.importer import RecordingError, import_recording
from .import_policy import check_readable, source_folder
from .pipeline import PipelineError, check_plan, extend_after_import
from .runtime import Reporter, hinted_backoff

#: Queue of the import kind.
QUEUE = "default"


def _import_check(payload: dict[str, Any]) -> dict[str, str]:
    if (payload.get("folder") is None) == (payload.get("files") is None):
        return {"folder": "Give either a folder or a list of files."}
    return {}


PAYLOAD = payloads.schema(
    "Import a recording",
    "Read a recording folder (or uploaded segment files) into one session: segments, danmaku, duration.",
    folder=payloads.field(
        "string",
        "Folder",
        "A recording folder under an import root, or one of your uploads (upload:<id>, as the upload answered).",
        max_length=4096,
        nullable=True,
    ),
    files=payloads.field("list", "Files", "Segment files instead of a folder, one per line.", nullable=True),
    check=_import_check,
    rules=("give either a folder or a list of files.",),
)


def _summary(payload: dict[str, Any]) -> str:
    if payload.get("folder"):
        return str(payload["folder"])
    files = payload.get("files") or []
    return f"{len(files)} file{'s' if len(files) != 1 else ''}: {', '.join(Path(f).name for f in files[:3])}"


@registry.kind(
    "import_recording",
    queue=QUEUE,
    payload=PAYLOAD,
    summary=_summary,
    safe_to_rerun=True,
    backoff=hinted_backoff,
    # Re-reading the same files gives the same answer: these fail the job at once.
    never_retry=(RecordingError, HostileXml, FileNotFoundError, NotADirectoryError, PipelineError),
)
def import_recording_job(ctx: JobContext, *, folder: str | None = None, files: list[str] | None = None) -> Any:
    """Import a recording folder (or uploaded segment files) as one session.

    Raises:
      RecordingError: No segments, several rooms, or an unreadable segment (the file is named);
        ImportNotAllowed (a RecordingError) for a path outside the import roots and the owner's uploads.
      HostileXml: A danmaku file tries entity expansion.
    """
    check_plan(ctx)  # as a pipeline's first step: refuse an impossible plan before any work
    if (folder is None) == (files is None):
        raise RecordingError("give either a folder or a list of files")
    if folder is not None:
        folder = source_folder(ctx, folder)
    check_readable(ctx, [folder] if folder is not None else list(files or []))
    source: Path | list[Path] = Path(folder) if folder is not None else [Path(f) for f in files or []]
    reporter = Reporter(ctx, 0.0, 0.95)
    try:
        imported = import_recording(source, progress=reporter.progress, should_stop=reporter.should_stop)
    except Cancelled:
        reporter.reraise()
        raise JobCancelled() from None
    for warning in imported.warnings:
        ctx.event("import_warning", file=warning.file, kind=warning.kind, message=warning.message)
    with ctx.result_transaction() as tx:
        session_id, created = store.session_upsert(
            tx.connection,
            owner_id=ctx.owner_id,
            imported=imported,
            folder=str(folder if folder is not None else Path(files[0]).parent),  # type: ignore[index]
            job_id=ctx.job_id,
        )
        result = {
            "session_id": session_id,
            "created": created,
            "room_id": imported.room_id,
            "title": imported.title,
            "duration_s": round(imported.duration_s, 3),
            "segments": [
                {
                    "index": s.index,
                    "file": s.path.name,
                    "offset_s": round(s.offset_s, 3),
                    "duration_s": round(s.duration_s, 3),
                    "status": s.status,
                    "danmaku_comments": s.danmaku.stats.comments if s.danmaku else None,
                }
                for s in imported.segments
            ],
            "danmaku": {
                k: v
                for k, v in dataclasses.asdict(imported.danmaku).items()
                if k not in ("first_offset_s", "last_offset_s")
            },
            "warnings": [dataclasses.asdict(w) for w in imported.warnings],
        }
        extend_after_import(ctx, tx, result)  # a pipeline step: its next steps commit with its result
        tx.complete(result)
    return result
