"""Executions still exiting: an attempt that timed out while its thread would not stop.

- ``job_exits``: one row per such attempt (the job is already ``failed``; its thread runs on, e.g.
  blocked in C code). The worker process's keeper renews ``lease_expires_at`` while the thread lives
  and deletes the row when it returns; a row whose lease expired (the worker process died) is ended
  by recovery. A manual retry of the job is refused while its row's lease is live.
  ``jobs/models.py`` mirrors it and ``jobs/exit_store.py`` holds its SQL.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-12
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_exits",
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(200), nullable=False),
        sa.Column("timed_out_at", sa.BigInteger(), nullable=False),
        sa.Column("lease_expires_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_job_exits"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_exits_job_id_jobs", ondelete="CASCADE"),
    )
    op.create_index("ix_job_exits_lease", "job_exits", ["lease_expires_at"])


def downgrade() -> None:
    op.drop_index("ix_job_exits_lease", table_name="job_exits")
    op.drop_table("job_exits")
