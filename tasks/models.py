"""SQLAlchemy models of the actors' domain tables (Alembic revision ``0004_media`` creates them).

- ``recording_sessions``: one imported recording per (owner, recorder key); re-importing the same
  folder updates the same row (same id), so an import is idempotent.
- ``recording_segments``: the session's segments in timeline order (``offset_s`` is the sum of the
  previous segments' true durations); replaced as a whole by a re-import.
- ``danmaku_stats``: per segment, the counts of its danmaku XML (absent when the segment has none).
- ``transcripts``: ASR output of a segment or a range of it (cues as JSON, the SRT file's path);
  one row per (session, segment, range), replaced by a newer transcription of the same range.
- ``clips``: rendered clips; the row is written in the render job's result transaction, so it
  exists iff the job succeeded, and names only files that exist (per-attempt names).
- ``output_root_health``: the output-root write gate's shared state, one row per root that ever
  degraded (revision ``0006``): degraded or healthy, the cached error, when it degraded, when the
  next probe is due and when the last one ran. ``output_root_blocked_jobs``: the jobs refused while
  a root is degraded (run at once when it recovers). The recording pipeline's DAG is in the job
  tables (workflows); revision ``0006`` drops the old ``pipeline_steps``.
- ``endpoint_health``: the notification circuit breaker's shared state; its definition is the
  domain's (:data:`tasks.domain.notify.store.endpoint_health`), mirrored here for the migration.

Times are integer milliseconds since the epoch, as in the job tables; media positions are float seconds.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from jobs.models import NAMING_CONVENTION
from tasks.domain.notify.store import endpoint_health as domain_endpoint_health


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class RecordingSession(Base):
    """An imported recording (one room's segments)."""

    __tablename__ = "recording_sessions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[str] = mapped_column(String(200))
    key: Mapped[str] = mapped_column(String(200))
    folder: Mapped[str] = mapped_column(Text)
    room_id: Mapped[int] = mapped_column(BigInteger)
    title: Mapped[str] = mapped_column(Text)
    started_at: Mapped[int] = mapped_column(BigInteger)
    duration_s: Mapped[float] = mapped_column(Float)
    segment_count: Mapped[int] = mapped_column(Integer)
    warning_count: Mapped[int] = mapped_column(Integer)
    import_job_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        UniqueConstraint("owner_id", "key"),
        CheckConstraint("duration_s >= 0 AND segment_count >= 1", name="sane"),
    )


class RecordingSegment(Base):
    """One segment file of a session."""

    __tablename__ = "recording_segments"

    session_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("recording_sessions.id", ondelete="CASCADE"), primary_key=True
    )
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    path: Mapped[str] = mapped_column(Text)
    started_at: Mapped[int] = mapped_column(BigInteger)
    offset_s: Mapped[float] = mapped_column(Float)
    duration_s: Mapped[float] = mapped_column(Float)
    header_duration_s: Mapped[float | None] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16))
    has_video: Mapped[bool] = mapped_column(Boolean)
    has_audio: Mapped[bool] = mapped_column(Boolean)
    width: Mapped[int | None] = mapped_column(Integer)
    height: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (
        CheckConstraint("status IN ('ok', 'truncated')", name="status_known"),
        CheckConstraint("idx >= 0 AND offset_s >= 0 AND duration_s >= 0", name="sane"),
    )


class DanmakuStats(Base):
    """Danmaku counts of one segment's XML."""

    __tablename__ = "danmaku_stats"

    session_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    segment_idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    xml_path: Mapped[str] = mapped_column(Text)
    comments: Mapped[int] = mapped_column(Integer)
    superchats: Mapped[int] = mapped_column(Integer)
    gifts: Mapped[int] = mapped_column(Integer)
    guards: Mapped[int] = mapped_column(Integer)
    unique_users: Mapped[int] = mapped_column(Integer)
    peak_per_10s: Mapped[int] = mapped_column(Integer)
    malformed: Mapped[bool] = mapped_column(Boolean)
    error_count: Mapped[int] = mapped_column(Integer)

    __table_args__ = (
        # Deleting a segment (a re-import replaces them) deletes its stats.
        ForeignKeyConstraint(
            ["session_id", "segment_idx"],
            ["recording_segments.session_id", "recording_segments.idx"],
            ondelete="CASCADE",
        ),
    )


class Transcript(Base):
    """ASR output for ``[start_s, end_s)`` of a segment (segment-local times; cues are too)."""

    __tablename__ = "transcripts"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(32), ForeignKey("recording_sessions.id", ondelete="CASCADE"))
    segment_idx: Mapped[int] = mapped_column(Integer)
    start_ms: Mapped[int] = mapped_column(BigInteger)
    end_ms: Mapped[int] = mapped_column(BigInteger)
    language: Mapped[str] = mapped_column(String(16))
    text: Mapped[str] = mapped_column(Text)
    cues: Mapped[str] = mapped_column(Text)
    srt_path: Mapped[str] = mapped_column(Text)
    job_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        UniqueConstraint("session_id", "segment_idx", "start_ms", "end_ms"),
        CheckConstraint("end_ms >= start_ms AND start_ms >= 0", name="range"),
    )


class Clip(Base):
    """A rendered clip; written with its job's result, so it exists iff the render succeeded."""

    __tablename__ = "clips"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(32), ForeignKey("recording_sessions.id", ondelete="CASCADE"))
    job_id: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer)
    start_s: Mapped[float] = mapped_column(Float)
    end_s: Mapped[float] = mapped_column(Float)
    path: Mapped[str] = mapped_column(Text)
    thumbnail_path: Mapped[str | None] = mapped_column(Text)
    duration_s: Mapped[float] = mapped_column(Float)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    subtitle_cues: Mapped[int] = mapped_column(Integer)
    danmaku_comments: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        UniqueConstraint("job_id"),
        CheckConstraint("end_s > start_s AND start_s >= 0", name="window"),
        Index("ix_clips_session", "session_id"),
    )


class OutputRootHealth(Base):
    """The write gate of one output root, shared by every worker process (times: Unix seconds)."""

    __tablename__ = "output_root_health"

    root: Mapped[str] = mapped_column(String(1024), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    degraded_since: Mapped[float | None] = mapped_column(Float)
    next_probe_at: Mapped[float | None] = mapped_column(Float)
    last_probe_at: Mapped[float | None] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        CheckConstraint("state IN ('healthy', 'degraded')", name="state"),
        # degraded iff it has a since and a next probe time; a healthy root caches no error
        CheckConstraint(
            "(state = 'degraded') = (degraded_since IS NOT NULL AND next_probe_at IS NOT NULL)", name="degraded_times"
        ),
        CheckConstraint("state = 'degraded' OR error IS NULL", name="error_iff_degraded"),
    )


class OutputRootBlockedJob(Base):
    """A job refused while its output root was degraded (cleared, and the job run at once, on recovery)."""

    __tablename__ = "output_root_blocked_jobs"

    root: Mapped[str] = mapped_column(String(1024), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    blocked_at: Mapped[float] = mapped_column(Float)


metadata = Base.metadata
# The breaker table belongs to the domain's notify store; copy its definition onto this metadata so
# one metadata describes every table of revision 0004 (the migration test compares against it).
endpoint_health = domain_endpoint_health.to_metadata(metadata)
