"""The trace context of a job's submit on its row (``jobs.trace_context``; ``jobs/tracing.py``).

Written at submit when tracing is on (the W3C ``traceparent``/``tracestate`` of the submit's span, as
JSON), NULL otherwise; never updated. A message written outside any span — recovery's fresh message
for a job whose worker was lost — carries it, so that attempt stays in the submit's trace.

A plain ``ADD COLUMN`` (no table rebuild on SQLite, so the table's constraints keep their names).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("trace_context", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "trace_context")
