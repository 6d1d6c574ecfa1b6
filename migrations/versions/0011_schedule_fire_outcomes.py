"""Schedule fire outcomes: duplicate attempts and skipped ticks on each fire row (tasks/scheduling/store.py).

- ``duplicates``: how many other fire attempts found this tick already fired (a scheduler whose plan
  was read before another process's fire committed; the fence refused it). Counted in the losing
  attempt's transaction.
- ``skipped`` / ``skipped_from``: scheduled ticks between the previous fence (last scheduled fire or
  anchor) and this tick that never fired, because the catch-up policy or the grace window dropped
  them after downtime; ``skipped_from`` is the earliest of them. Counted, up to a cap, in the fire's
  own transaction. Ticks missed while paused are not counted: resuming re-anchors the schedule.

Plain ``ADD COLUMN``s (no table rebuild on SQLite, so the table's constraints keep their names).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("schedule_fires", sa.Column("duplicates", sa.Integer(), server_default=sa.text("0"), nullable=False))
    op.add_column("schedule_fires", sa.Column("skipped", sa.Integer(), server_default=sa.text("0"), nullable=False))
    op.add_column("schedule_fires", sa.Column("skipped_from", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("schedule_fires", "skipped_from")
    op.drop_column("schedule_fires", "skipped")
    op.drop_column("schedule_fires", "duplicates")
