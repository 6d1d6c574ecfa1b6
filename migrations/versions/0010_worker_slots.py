"""Supervised worker slots: what the Workers page shows about restarts and slots given up.

- ``worker_slots``: one row per slot of every live supervisor (``tenure worker``, ``tenure
  scheduler``, ``tenure relay``): its child's pid, restarts, crash streak, last exit, state
  (``running`` | ``restarting`` | ``given_up`` | ``stopped``) and a heartbeat. The supervisor writes it; the web
  process reads the rows whose heartbeat is recent. ``monitoring/models.py`` mirrors it and
  ``monitoring/store.py`` holds its SQL.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "worker_slots",
        sa.Column("supervisor", sa.String(200), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("supervisor_pid", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("crashes", sa.Integer(), nullable=False),
        sa.Column("last_exit", sa.String(100), nullable=True),
        sa.Column("last_exit_at", sa.BigInteger(), nullable=True),
        sa.Column("restart_at", sa.BigInteger(), nullable=True),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("heartbeat_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("supervisor", "slot", name="pk_worker_slots"),
        sa.CheckConstraint("state IN ('running', 'restarting', 'given_up', 'stopped')", name="ck_worker_slots_state"),
        sa.CheckConstraint("(state = 'running') = (pid IS NOT NULL)", name="ck_worker_slots_pid_iff_running"),
        sa.CheckConstraint(
            "(state = 'restarting') = (restart_at IS NOT NULL)", name="ck_worker_slots_restart_at_iff_restarting"
        ),
        sa.CheckConstraint("restarts >= 0 AND crashes >= 0", name="ck_worker_slots_counts"),
    )
    op.create_index("ix_worker_slots_heartbeat", "worker_slots", ["heartbeat_at"])


def downgrade() -> None:
    op.drop_index("ix_worker_slots_heartbeat", table_name="worker_slots")
    op.drop_table("worker_slots")
