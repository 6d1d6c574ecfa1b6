"""An index for the activity chart: finished jobs in completion order, holding the times it reads.

The chart (``jobs.read_store.job_activity``) reads every job that finished in its window: with only
``ix_jobs_status_completed`` (``status``, ``completed_at``) that was one range per finished status and
a table lookup per job for its created and started times (147,000 jobs in the last 24 h of a 1M-job
table: ~4 s on SQLite, ~1.2 s on PostgreSQL; bench/queries_bench.py).

``ix_jobs_finished_times`` (``completed_at``, ``status``, ``created_at``, ``started_at``) covers it: one
range read, no lookups. Partial on ``completed_at IS NOT NULL`` like the other finished-job indexes: a job
enters it once, when it finishes; a claim (which leaves ``completed_at`` NULL) never writes it.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_jobs_finished_times",
        "jobs",
        ["completed_at", "status", "created_at", "started_at"],
        sqlite_where=sa.text("completed_at IS NOT NULL"),
        postgresql_where=sa.text("completed_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_finished_times", table_name="jobs")
