"""Runtime settings: one row per batch an admin saved (append-only; the latest row is in force).

``jobs/runtime_settings_models.py`` mirrors this table; ``jobs/runtime_settings_store.py`` holds its SQL.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "runtime_settings",
        sa.Column("revision", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("saved_at", sa.BigInteger(), nullable=False),
        sa.Column("saved_by", sa.String(200), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("revision", name="pk_runtime_settings"),
        sa.CheckConstraint("revision >= 1", name="ck_runtime_settings_revision_positive"),
    )


def downgrade() -> None:
    op.drop_table("runtime_settings")
