"""Schedules: per-schedule state and the exactly-once fire record (tasks/scheduling/store.py).

Revision ID: 0003
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("paused", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("paused_at", sa.BigInteger(), nullable=True),
        sa.Column("paused_by", sa.String(200), nullable=True),
        sa.Column("anchor_ms", sa.BigInteger(), nullable=False),
        sa.Column("last_fire_ms", sa.BigInteger(), nullable=True),
        sa.Column("spec", sa.Text(), nullable=True),
        sa.Column("next_fire_ms", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_schedules"),
        sa.CheckConstraint("paused IN (0, 1)", name="ck_schedules_paused_flag"),
        sa.CheckConstraint("(paused = 1) = (paused_at IS NOT NULL)", name="ck_schedules_paused_at"),
    )
    op.create_table(
        "schedule_fires",
        sa.Column("schedule", sa.String(200), nullable=False),
        sa.Column("fire_time", sa.BigInteger(), nullable=False),
        sa.Column("cause", sa.String(16), nullable=False),
        sa.Column("message_id", sa.String(64), nullable=True),
        sa.Column("job_id", sa.String(64), nullable=True),
        sa.Column("due_at", sa.BigInteger(), nullable=False),
        sa.Column("fired_by", sa.String(200), nullable=False),
        sa.Column("fired_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("schedule", "fire_time", name="pk_schedule_fires"),
        sa.ForeignKeyConstraint(
            ["schedule"], ["schedules.name"], name="fk_schedule_fires_schedule_schedules", ondelete="CASCADE"
        ),
        sa.CheckConstraint("cause IN ('schedule', 'catchup', 'manual')", name="ck_schedule_fires_cause"),
    )


def downgrade() -> None:
    op.drop_table("schedule_fires")
    op.drop_table("schedules")
