"""The recording pipeline runs on the job layer's workflows; the output-root write gate's state is shared.

- ``pipeline_steps`` is dropped: the pipeline's DAG is in ``jobs`` (``parent_job_id``) and
  ``job_dependencies``, like every workflow's. Old rows described supervisor pipelines, whose steps
  keep their ``parent_job_id``.
- ``output_root_health`` (one row per output root that ever degraded) and ``output_root_blocked_jobs``
  (jobs refused while it is degraded) hold the write gate's state for every worker process;
  ``tasks/models.py`` mirrors them and ``tasks/store.py`` (``SQLGateStore``) holds their SQL.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_pipeline_steps_job", table_name="pipeline_steps")
    op.drop_table("pipeline_steps")
    op.create_table(
        "output_root_health",
        sa.Column("root", sa.String(1024), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("degraded_since", sa.Float(), nullable=True),
        sa.Column("next_probe_at", sa.Float(), nullable=True),
        sa.Column("last_probe_at", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("root", name="pk_output_root_health"),
        sa.CheckConstraint("state IN ('healthy', 'degraded')", name="ck_output_root_health_state"),
        sa.CheckConstraint(
            "(state = 'degraded') = (degraded_since IS NOT NULL AND next_probe_at IS NOT NULL)",
            name="ck_output_root_health_degraded_times",
        ),
        sa.CheckConstraint("state = 'degraded' OR error IS NULL", name="ck_output_root_health_error_iff_degraded"),
    )
    op.create_table(
        "output_root_blocked_jobs",
        sa.Column("root", sa.String(1024), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("blocked_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("root", "job_id", name="pk_output_root_blocked_jobs"),
    )


def downgrade() -> None:
    op.drop_table("output_root_blocked_jobs")
    op.drop_table("output_root_health")
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
