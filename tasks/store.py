"""All SQL of the actors' domain tables (see :mod:`tasks.models` for the tables and their invariants).

One function per query, named entity-first. Callers pass the connection: writes run inside the
job's ``result_transaction`` (``tx.connection``), so the domain rows and the job's result commit
together or not at all; reads take a short read transaction of their own. Rows come back as frozen
dataclasses. The breaker's ``endpoint_health`` SQL lives with the breaker
(:class:`tasks.domain.notify.store.SQLBreakerStore`), on the same table.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, insert, select
from sqlalchemy.dialects import postgresql, sqlite

from jobs.store import now_ms

from .domain.recording.importer import RecordingSession as ImportedSession
from .models import Clip, DanmakuStats, PipelineStep, RecordingSegment, RecordingSession, Transcript

_sessions = RecordingSession.__table__
_segments = RecordingSegment.__table__
_danmaku = DanmakuStats.__table__
_transcripts = Transcript.__table__
_clips = Clip.__table__
_steps = PipelineStep.__table__


@dataclass(frozen=True)
class SessionRow:
    id: str
    owner_id: str
    key: str
    folder: str
    room_id: int
    title: str
    started_at: int
    duration_s: float
    segment_count: int
    warning_count: int
    import_job_id: str
    created_at: int
    updated_at: int


@dataclass(frozen=True)
class SegmentRow:
    """A stored segment; it satisfies the renderer's ``TimelineSegment`` protocol (``path`` is a Path)."""

    session_id: str
    idx: int
    path: Any  # pathlib.Path
    started_at: int
    offset_s: float
    duration_s: float
    header_duration_s: float | None
    status: str
    has_video: bool
    has_audio: bool
    width: int | None
    height: int | None


@dataclass(frozen=True)
class TranscriptRow:
    id: str
    session_id: str
    segment_idx: int
    start_ms: int
    end_ms: int
    language: str
    text: str
    cues: list[dict[str, Any]]
    srt_path: str
    job_id: str
    created_at: int


@dataclass(frozen=True)
class StepRow:
    pipeline_job_id: str
    step: str
    job_id: str
    kind: str
    depends_on: tuple[str, ...]
    reused: bool
    created_at: int


def _insert(conn: Connection, table: Any) -> Any:
    return (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(table)


# -- sessions -----------------------------------------------------------------------------------------
def session_upsert(
    conn: Connection, *, owner_id: str, imported: ImportedSession, folder: str, job_id: str
) -> tuple[str, bool]:
    """Insert or update the owner's session with the recorder key of *imported*; replace its segments.

    The upsert is one statement on the ``(owner_id, key)`` unique constraint, so two imports of the
    same folder can never make two sessions. Returns ``(session_id, created)``.
    """
    now = now_ms()
    values = {
        "folder": folder,
        "room_id": imported.room_id,
        "title": imported.title,
        "started_at": int(imported.started_at.timestamp() * 1000),
        "duration_s": imported.duration_s,
        "segment_count": len(imported.segments),
        "warning_count": len(imported.warnings),
        "import_job_id": job_id,
        "updated_at": now,
    }
    new_id = uuid.uuid4().hex
    stmt = _insert(conn, _sessions).values(id=new_id, owner_id=owner_id, key=imported.key, created_at=now, **values)
    stmt = stmt.on_conflict_do_update(index_elements=["owner_id", "key"], set_=values).returning(_sessions.c.id)
    session_id = conn.execute(stmt).scalar_one()
    # Replacing the segments deletes their danmaku stats too (ON DELETE CASCADE).
    conn.execute(delete(_segments).where(_segments.c.session_id == session_id))
    for seg in imported.segments:
        conn.execute(
            insert(_segments).values(
                session_id=session_id,
                idx=seg.index,
                path=str(seg.path),
                started_at=int(seg.started_at.timestamp() * 1000),
                offset_s=seg.offset_s,
                duration_s=seg.duration_s,
                header_duration_s=seg.header_duration_s,
                status=seg.status,
                has_video=seg.has_video,
                has_audio=seg.has_audio,
                width=seg.width,
                height=seg.height,
            )
        )
        if seg.danmaku is not None:
            s = seg.danmaku.stats
            conn.execute(
                insert(_danmaku).values(
                    session_id=session_id,
                    segment_idx=seg.index,
                    xml_path=str(seg.danmaku.path),
                    comments=s.comments,
                    superchats=s.superchats,
                    gifts=s.gifts,
                    guards=s.guards,
                    unique_users=s.unique_users,
                    peak_per_10s=s.peak_per_10s,
                    malformed=seg.danmaku.malformed,
                    error_count=seg.danmaku.error_count,
                )
            )
    return session_id, session_id == new_id


def session_get(conn: Connection, session_id: str) -> SessionRow | None:
    row = conn.execute(select(_sessions).where(_sessions.c.id == session_id)).mappings().one_or_none()
    return SessionRow(**row) if row is not None else None


def session_count(conn: Connection, owner_id: str) -> int:
    return len(conn.execute(select(_sessions.c.id).where(_sessions.c.owner_id == owner_id)).all())


def segment_list(conn: Connection, session_id: str) -> list[SegmentRow]:
    from pathlib import Path

    rows = conn.execute(select(_segments).where(_segments.c.session_id == session_id).order_by(_segments.c.idx))
    return [SegmentRow(**{**r, "path": Path(r["path"])}) for r in rows.mappings()]


def danmaku_stats_list(conn: Connection, session_id: str) -> list[dict[str, Any]]:
    rows = conn.execute(select(_danmaku).where(_danmaku.c.session_id == session_id).order_by(_danmaku.c.segment_idx))
    return [dict(r) for r in rows.mappings()]


# -- transcripts --------------------------------------------------------------------------------------
def transcript_upsert(
    conn: Connection,
    *,
    session_id: str,
    segment_idx: int,
    start_ms: int,
    end_ms: int,
    language: str,
    text: str,
    cues: list[dict[str, Any]],
    srt_path: str,
    job_id: str,
) -> str:
    """Store a transcript; a newer transcription of the same range replaces the older one. Returns its id."""
    values = {
        "language": language,
        "text": text,
        "cues": json.dumps(cues, ensure_ascii=False),
        "srt_path": srt_path,
        "job_id": job_id,
        "created_at": now_ms(),
    }
    stmt = _insert(conn, _transcripts).values(
        id=uuid.uuid4().hex,
        session_id=session_id,
        segment_idx=segment_idx,
        start_ms=start_ms,
        end_ms=end_ms,
        **values,
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=["session_id", "segment_idx", "start_ms", "end_ms"], set_=values
    ).returning(_transcripts.c.id)
    return str(conn.execute(stmt).scalar_one())


def transcript_list(conn: Connection, session_id: str) -> list[TranscriptRow]:
    rows = conn.execute(
        select(_transcripts)
        .where(_transcripts.c.session_id == session_id)
        .order_by(_transcripts.c.segment_idx, _transcripts.c.start_ms, _transcripts.c.created_at)
    )
    return [TranscriptRow(**{**r, "cues": json.loads(r["cues"])}) for r in rows.mappings()]


# -- clips --------------------------------------------------------------------------------------------
def clip_insert(conn: Connection, **values: Any) -> str:
    clip_id = uuid.uuid4().hex
    conn.execute(insert(_clips).values(id=clip_id, created_at=now_ms(), **values))
    return clip_id


def clip_list(conn: Connection, session_id: str) -> list[dict[str, Any]]:
    rows = conn.execute(select(_clips).where(_clips.c.session_id == session_id).order_by(_clips.c.created_at))
    return [dict(r) for r in rows.mappings()]


def clip_paths(conn: Connection) -> set[str]:
    """Every file a stored clip references (clip and thumbnail)."""
    out: set[str] = set()
    for path, thumb in conn.execute(select(_clips.c.path, _clips.c.thumbnail_path)):
        out.add(path)
        if thumb:
            out.add(thumb)
    return out


# -- pipeline steps -----------------------------------------------------------------------------------
def pipeline_step_insert(
    conn: Connection, *, pipeline_job_id: str, step: str, job_id: str, kind: str, depends_on: list[str], reused: bool
) -> bool:
    """Record a step of a pipeline (idempotent: an existing step row is kept). Returns whether it was new."""
    stmt = (
        _insert(conn, _steps)
        .values(
            pipeline_job_id=pipeline_job_id,
            step=step,
            job_id=job_id,
            kind=kind,
            depends_on=json.dumps(depends_on),
            reused=reused,
            created_at=now_ms(),
        )
        .on_conflict_do_nothing(index_elements=["pipeline_job_id", "step"])
    )
    return conn.execute(stmt).rowcount == 1


def pipeline_step_list(conn: Connection, pipeline_job_id: str) -> list[StepRow]:
    rows = conn.execute(
        select(_steps).where(_steps.c.pipeline_job_id == pipeline_job_id).order_by(_steps.c.created_at, _steps.c.step)
    )
    return [StepRow(**{**r, "depends_on": tuple(json.loads(r["depends_on"]))}) for r in rows.mappings()]
