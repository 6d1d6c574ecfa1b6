"""Indexes for listing jobs newest first without an owner filter.

An admin's job list, the bulk actions' count and any list without an owner filter are
``ORDER BY created_at DESC, id DESC`` pages over all jobs. Without these each page was a full scan (or
every job of the status) and a sort (a 20,000-job count: 100 pages, ~3 s).

- ``ix_jobs_created`` (``created_at``, ``id``): all statuses. ``created_at`` never changes after the
  insert, so status transitions never update it.
- ``ix_jobs_finished_created`` (``status``, ``created_at``, ``id``), finished jobs only: one terminal status
  (the list's status filter, bulk retry's candidates), the statuses that pile up. Partial, like
  ``ix_jobs_status_completed``: a job enters it once, when it finishes, so claims never touch it. The
  few queued and running jobs are found with ``ix_jobs_status_lease`` and sorted.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_created", "jobs", ["created_at", "id"])
    op.create_index(
        "ix_jobs_finished_created",
        "jobs",
        ["status", "created_at", "id"],
        sqlite_where=sa.text("completed_at IS NOT NULL"),
        postgresql_where=sa.text("completed_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_finished_created", table_name="jobs")
    op.drop_index("ix_jobs_created", table_name="jobs")
