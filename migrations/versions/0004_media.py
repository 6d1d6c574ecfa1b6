"""Media: recording sessions, segments, danmaku stats, transcripts, clips, pipeline steps, endpoint health.

The actors' domain tables (``tasks/models.py`` describes them; ``tasks/store.py`` holds their SQL).
This revision also merges the accounts (0002) and schedules (0003) branches into one head.

Revision ID: 0004
Revises: 0002, 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = ("0002", "0003")
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "recording_sessions",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("owner_id", sa.String(200), nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("folder", sa.Text(), nullable=False),
        sa.Column("room_id", sa.BigInteger(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("segment_count", sa.Integer(), nullable=False),
        sa.Column("warning_count", sa.Integer(), nullable=False),
        sa.Column("import_job_id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_recording_sessions"),
        sa.UniqueConstraint("owner_id", "key", name="uq_recording_sessions_owner_id_key"),
        sa.CheckConstraint("duration_s >= 0 AND segment_count >= 1", name="ck_recording_sessions_sane"),
    )
    op.create_table(
        "recording_segments",
        sa.Column("session_id", sa.String(32), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("offset_s", sa.Float(), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("header_duration_s", sa.Float(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("has_video", sa.Boolean(), nullable=False),
        sa.Column("has_audio", sa.Boolean(), nullable=False),
        sa.Column("width", sa.Integer(), nullable=True),
        sa.Column("height", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("session_id", "idx", name="pk_recording_segments"),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["recording_sessions.id"],
            name="fk_recording_segments_session_id_recording_sessions",
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("status IN ('ok', 'truncated')", name="ck_recording_segments_status_known"),
        sa.CheckConstraint("idx >= 0 AND offset_s >= 0 AND duration_s >= 0", name="ck_recording_segments_sane"),
    )
    op.create_table(
        "danmaku_stats",
        sa.Column("session_id", sa.String(32), nullable=False),
        sa.Column("segment_idx", sa.Integer(), nullable=False),
        sa.Column("xml_path", sa.Text(), nullable=False),
        sa.Column("comments", sa.Integer(), nullable=False),
        sa.Column("superchats", sa.Integer(), nullable=False),
        sa.Column("gifts", sa.Integer(), nullable=False),
        sa.Column("guards", sa.Integer(), nullable=False),
        sa.Column("unique_users", sa.Integer(), nullable=False),
        sa.Column("peak_per_10s", sa.Integer(), nullable=False),
        sa.Column("malformed", sa.Boolean(), nullable=False),
        sa.Column("error_count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", "segment_idx", name="pk_danmaku_stats"),
        sa.ForeignKeyConstraint(
            ["session_id", "segment_idx"],
            ["recording_segments.session_id", "recording_segments.idx"],
            name="fk_danmaku_stats_session_id_recording_segments",
            ondelete="CASCADE",
        ),
    )
    op.create_table(
        "transcripts",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("session_id", sa.String(32), nullable=False),
        sa.Column("segment_idx", sa.Integer(), nullable=False),
        sa.Column("start_ms", sa.BigInteger(), nullable=False),
        sa.Column("end_ms", sa.BigInteger(), nullable=False),
        sa.Column("language", sa.String(16), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("cues", sa.Text(), nullable=False),
        sa.Column("srt_path", sa.Text(), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_transcripts"),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["recording_sessions.id"],
            name="fk_transcripts_session_id_recording_sessions",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint(
            "session_id",
            "segment_idx",
            "start_ms",
            "end_ms",
            name="uq_transcripts_session_id_segment_idx_start_ms_end_ms",
        ),
        sa.CheckConstraint("end_ms >= start_ms AND start_ms >= 0", name="ck_transcripts_range"),
    )
    op.create_table(
        "clips",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("session_id", sa.String(32), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("start_s", sa.Float(), nullable=False),
        sa.Column("end_s", sa.Float(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("thumbnail_path", sa.Text(), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("subtitle_cues", sa.Integer(), nullable=False),
        sa.Column("danmaku_comments", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_clips"),
        sa.ForeignKeyConstraint(
            ["session_id"], ["recording_sessions.id"], name="fk_clips_session_id_recording_sessions", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("job_id", name="uq_clips_job_id"),
        sa.CheckConstraint("end_s > start_s AND start_s >= 0", name="ck_clips_window"),
    )
    op.create_index("ix_clips_session", "clips", ["session_id"])
    op.create_table(
        "pipeline_steps",
        sa.Column("pipeline_job_id", sa.String(32), nullable=False),
        sa.Column("step", sa.String(100), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(200), nullable=False),
        sa.Column("depends_on", sa.Text(), nullable=False),
        sa.Column("reused", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("pipeline_job_id", "step", name="pk_pipeline_steps"),
    )
    op.create_index("ix_pipeline_steps_job", "pipeline_steps", ["job_id"])
    # The notification breaker's shared state (tasks/domain/notify/store.py defines it).
    op.create_table(
        "endpoint_health",
        sa.Column("endpoint", sa.String(512), nullable=False),
        sa.Column("state", sa.String(16), server_default="closed", nullable=False),
        sa.Column("consecutive_failures", sa.Integer(), server_default="0", nullable=False),
        sa.Column("opened_at", sa.Float(), nullable=True),
        sa.Column("probe_until", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("endpoint", name="pk_endpoint_health"),
        sa.CheckConstraint("state IN ('closed', 'open', 'disabled')", name="ck_endpoint_health_state"),
        sa.CheckConstraint("(state = 'open') = (opened_at IS NOT NULL)", name="ck_endpoint_health_opened_iff_open"),
        sa.CheckConstraint("consecutive_failures >= 0", name="ck_endpoint_health_failures"),
    )


def downgrade() -> None:
    op.drop_table("endpoint_health")
    op.drop_index("ix_pipeline_steps_job", table_name="pipeline_steps")
    op.drop_table("pipeline_steps")
    op.drop_index("ix_clips_session", table_name="clips")
    op.drop_table("clips")
    op.drop_table("transcripts")
    op.drop_table("danmaku_stats")
    op.drop_table("recording_segments")
    op.drop_table("recording_sessions")
