"""All SQL of the actors' domain tables (see :mod:`tasks.models` for the tables and their invariants).

One function per query, named entity-first. Callers pass the connection: writes run inside the
job's ``result_transaction`` (``tx.connection``), so the domain rows and the job's result commit
together or not at all; reads take a short read transaction of their own. Rows come back as frozen
dataclasses. The breaker's ``endpoint_health`` SQL lives with the breaker
(:class:`tasks.domain.notify.store.SQLBreakerStore`), on the same table. The output-root write gate's
shared state is :class:`SQLGateStore` (tables ``output_root_health``, ``output_root_blocked_jobs``).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from jobs import db
from jobs.store import now_ms

from .domain.recording.importer import RecordingSession as ImportedSession
from .domain.write_gate import GateRecord
from .models import (
    Clip,
    DanmakuStats,
    OutputRootBlockedJob,
    OutputRootHealth,
    RecordingSegment,
    RecordingSession,
    Transcript,
)

_sessions = RecordingSession.__table__
_segments = RecordingSegment.__table__
_danmaku = DanmakuStats.__table__
_transcripts = Transcript.__table__
_clips = Clip.__table__
_gates = OutputRootHealth.__table__
_blocked = OutputRootBlockedJob.__table__


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


def segment_list(conn: Connection, session_id: str, *, owner_id: str) -> list[SegmentRow]:
    """The segments of *owner_id*'s session *session_id*; none for another owner's session (a job
    naming a session id it learnt elsewhere must not read, transcribe or render that recording)."""
    from pathlib import Path

    rows = conn.execute(
        select(_segments)
        .join(_sessions, _sessions.c.id == _segments.c.session_id)
        .where(_segments.c.session_id == session_id, _sessions.c.owner_id == owner_id)
        .order_by(_segments.c.idx)
    )
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


# -- output-root write gate (shared by every worker process) ------------------------------------------
class SQLGateStore:
    """The write gate's :class:`~tasks.domain.write_gate.GateStore` in the job database.

    Each method is one short transaction; every decision (a transition, the probe claim) is one
    conditional UPDATE, so of several processes exactly one wins it. Writes go through
    :func:`jobs.db.write` (``BEGIN IMMEDIATE`` on SQLite, queued behind this process's other writers).
    Times are the gate's clock: Unix seconds.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def gate_get(self, root: str) -> GateRecord | None:
        with db.read(self.engine) as conn:
            row = conn.execute(select(_gates).where(_gates.c.root == root)).one_or_none()
        return None if row is None else _gate_record(row)

    def gate_degrade(self, root: str, error: str, now: float, next_probe_at: float, job_id: str | None) -> bool:
        with db.write(self.engine) as tx:
            conn = tx.conn
            conn.execute(
                _insert(conn, _gates)
                .values(root=root, state="healthy", updated_at=now)
                .on_conflict_do_nothing(index_elements=["root"])
            )
            changed = conn.execute(
                update(_gates)
                .where(_gates.c.root == root, _gates.c.state == "healthy")
                .values(
                    state="degraded",
                    error=error[:MAX_GATE_ERROR_CHARS],
                    degraded_since=now,
                    next_probe_at=next_probe_at,
                    updated_at=now,
                )
            ).rowcount
            if job_id is not None:
                _block(conn, root, job_id, now)
        return changed == 1

    def gate_block(self, root: str, job_id: str) -> None:
        with db.write(self.engine) as tx:
            _block(tx.conn, root, job_id, time.time())

    def gate_claim_probe(self, root: str, now: float, next_probe_at: float) -> bool:
        with db.write(self.engine) as tx:
            claimed = tx.conn.execute(
                update(_gates)
                .where(_gates.c.root == root, _gates.c.state == "degraded", _gates.c.next_probe_at <= now)
                .values(next_probe_at=next_probe_at, last_probe_at=now, updated_at=now)
            ).rowcount
        return claimed == 1

    def gate_probe_failed(self, root: str, error: str, now: float) -> None:
        with db.write(self.engine) as tx:
            tx.conn.execute(
                update(_gates)
                .where(_gates.c.root == root, _gates.c.state == "degraded")
                .values(error=error[:MAX_GATE_ERROR_CHARS], updated_at=now)
            )

    def gate_recover(self, root: str, now: float) -> tuple[bool, frozenset[str], float | None]:
        with db.write(self.engine) as tx:
            conn = tx.conn
            # Locked (SQLite: the write lock taken at BEGIN): nobody recovers or degrades it in between.
            since = conn.execute(
                select(_gates.c.degraded_since)
                .where(_gates.c.root == root, _gates.c.state == "degraded")
                .with_for_update()
            ).scalar_one_or_none()
            if since is None:
                return False, frozenset(), None
            conn.execute(
                update(_gates)
                .where(_gates.c.root == root, _gates.c.state == "degraded")
                .values(state="healthy", error=None, degraded_since=None, next_probe_at=None, updated_at=now)
            )
            blocked = conn.execute(delete(_blocked).where(_blocked.c.root == root).returning(_blocked.c.job_id))
            blocked_ids = frozenset(r[0] for r in blocked)
        return True, blocked_ids, float(since)

    def gate_blocked(self, root: str) -> frozenset[str]:
        with db.read(self.engine) as conn:
            return frozenset(r[0] for r in conn.execute(select(_blocked.c.job_id).where(_blocked.c.root == root)))

    def gate_degraded(self) -> dict[str, str]:
        with db.read(self.engine) as conn:
            rows = conn.execute(select(_gates.c.root, _gates.c.error).where(_gates.c.state == "degraded"))
            return {r.root: r.error or "" for r in rows}


#: The cached error is truncated to this many characters.
MAX_GATE_ERROR_CHARS = 500


def _block(conn: Connection, root: str, job_id: str, now: float) -> None:
    conn.execute(
        _insert(conn, _blocked)
        .values(root=root, job_id=job_id, blocked_at=now)
        .on_conflict_do_nothing(index_elements=["root", "job_id"])
    )


def _gate_record(row: Any) -> GateRecord:
    return GateRecord(
        root=row.root,
        state=row.state,
        error=row.error,
        degraded_since=row.degraded_since,
        next_probe_at=row.next_probe_at,
        last_probe_at=row.last_probe_at,
    )
