"""PostgreSQL: one owner's jobs of one status, newest first, from one index range.

A user's list filtered by status (``GET /api/jobs?status=failed``, with or without a search) found that
owner's jobs of the status with a ``BitmapAnd`` of ``ix_jobs_owner_created`` and ``ix_jobs_status_kind``,
then read every one of them from the table: at 1,000,000 jobs, one user's 6,417 failed jobs were 6,055 heap
pages, 30 of the 43 ms of a search for ``0–`` among them (bench/queries_bench.py, p99 85.5 ms against
50). ``ix_jobs_owner_status_created`` (``owner_id``, ``status``, ``created_at``, ``id``) hands them over in
page order, and a search joins its matches against the index alone.

PostgreSQL only. A job's status change already writes an entry in every index of ``jobs`` there (it is
never a HOT update: ``status`` is in ``ix_jobs_status_kind``), so this is one more entry per write,
whichever columns it holds. On SQLite, which rewrites only the indexes holding a changed column, it would
be two more index writes per claim and per completion; SQLite's plans read the owner's range of
``ix_jobs_owner_created`` instead (``jobs.read_store``), within the goal.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0023"
down_revision: str | Sequence[str] | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE INDEX ix_jobs_owner_status_created ON jobs (owner_id, status, created_at, id)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX ix_jobs_owner_status_created")
