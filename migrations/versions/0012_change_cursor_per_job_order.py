"""The PostgreSQL change cursor keeps each job's events in the order they committed.

Revision 0009 positions an event at ``(change_xid, change_id)``: the writing transaction's id, then
a sequence value. Transaction ids are handed out when a transaction first writes, not when it
commits. A transaction that moves two jobs (a recovery batch, a workflow's cancel reaching its
steps) takes its id at the first job. If it reaches the second job only after a younger transaction
has committed an event of that job, its event would sort before the younger one, and the feed would
deliver that job's events out of order.

``job_events_change_order`` (BEFORE INSERT) raises a new event's ``change_xid`` to its job's newest
event's when that one is larger. The feed's guarantees still hold: the stored xid is never below
the writer's own, so "below the oldest running transaction" still means "its writer has ended".
The job's newest event is the one with the highest ``sequence``. The job row's lock reserves each
sequence, so that event has committed and the insert sees it, and by this rule its xid is the
job's largest. SQLite needs nothing: it commits one writer at a time, so ``rowid`` order is commit
order.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        """CREATE FUNCTION job_events_change_order() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          NEW.change_xid := greatest(NEW.change_xid, (
            SELECT e.change_xid FROM job_events e WHERE e.job_id = NEW.job_id ORDER BY e.sequence DESC LIMIT 1));
          RETURN NEW;
        END $$"""
    )
    op.execute(
        "CREATE TRIGGER job_events_change_order BEFORE INSERT ON job_events "
        "FOR EACH ROW EXECUTE FUNCTION job_events_change_order()"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER job_events_change_order ON job_events")
    op.execute("DROP FUNCTION job_events_change_order()")
