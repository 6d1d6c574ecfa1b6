"""Retention: indexes for finding what to prune, and the live feed's pruned-through mark.

- ``ix_jobs_status_completed``: ``jobs.retention`` finds jobs past their retention with it
  (partial: finished jobs only, so transitions of live jobs never update it).
- ``ix_outbox_job``: deleting a job looks up its outbox rows (the foreign key is ON DELETE SET
  NULL); without it that was a full scan of the outbox per deleted job.
- ``retention_marks``: named high-water marks kept by retention. ``job_events.pruned_through`` is
  the highest ``job_events`` rowid retention deleted (SQLite): a live-feed cursor below it may have
  missed a deleted event, so ``jobs.queries.changes_after`` reports it and the client resyncs.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-09
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_jobs_status_completed",
        "jobs",
        ["status", "completed_at"],
        sqlite_where=sa.text("completed_at IS NOT NULL"),
        postgresql_where=sa.text("completed_at IS NOT NULL"),
    )
    op.create_index("ix_outbox_job", "outbox", ["job_id"])
    op.create_table(
        "retention_marks",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_retention_marks"),
    )


def downgrade() -> None:
    op.drop_table("retention_marks")
    op.drop_index("ix_outbox_job", table_name="outbox")
    op.drop_index("ix_jobs_status_completed", table_name="jobs")
