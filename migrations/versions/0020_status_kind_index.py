"""The status index also holds the kind: a count of one status and kind reads one index range.

A bulk action's dry run counts its candidates exactly, e.g. every failed ``render_clip`` job. With
``ix_jobs_status_lease`` (``status``, ``lease_expires_at``) that read every job of the status and looked
each one up for its kind: on 1,000,000 jobs, 89,782 failed ones for 31,357 matches, ~200 ms on
PostgreSQL (bench/queries_bench.py). ``ix_jobs_status_kind`` (``status``, ``kind``,
``lease_expires_at``) replaces it and counts them from the index alone (~3 ms).

It is the same index with a column that never changes, not one more: a claim or a completion rewrites
exactly the entries it rewrote before. What used the old index still can: the lease recovery's
``status = 'running' AND lease_expires_at < now`` reads the running jobs' range (few: bounded by the
workers' threads), and the live statuses' lists find their jobs by status.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_status_kind", "jobs", ["status", "kind", "lease_expires_at"])
    op.drop_index("ix_jobs_status_lease", table_name="jobs")


def downgrade() -> None:
    op.create_index("ix_jobs_status_lease", "jobs", ["status", "lease_expires_at"])
    op.drop_index("ix_jobs_status_kind", table_name="jobs")
