"""``jobs_status_moves`` checks every write of ``status``, not only a change of it.

Revision 0009's trigger fired only when the status changed (``WHEN NEW.status IS NOT OLD.status``), so a
statement writing a job's own status again went through: ``UPDATE jobs SET status = 'succeeded',
completed_at = … WHERE id = <a succeeded job>`` rewrote a finished job, and ``queued → queued`` passed
though ``jobs.status.ALLOWED`` has neither (the transition walk, tests/integration/jobs/
test_transition_walk.py, found both). Now the trigger fires on every UPDATE that sets ``status`` and
the pair (old, new) must be one of ``ALLOWED`` (a claim that meets a safe job's expired lease recovers it
first, ``running → queued``, then claims it: there is no ``running → running``); a finished job's status
is never written again. Updates that do not set
``status`` (progress, heartbeats, cancel requests) do not fire it, as before.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The allowed status moves (from>to), as jobs/status.py's ALLOWED was when this revision was written.
MOVES = (
    "'queued>running', 'queued>cancelled', 'queued>failed', 'running>succeeded', "
    "'running>failed', 'running>cancelled', 'running>queued', 'running>interrupted'"
)


def _install(moves: str, *, only_changes: bool) -> None:
    """(Re)create ``jobs_status_moves`` refusing any pair outside *moves*; *only_changes*: revision 0009's
    form, which fires only when the status changes."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"""CREATE OR REPLACE FUNCTION jobs_status_moves() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF (OLD.status || '>' || NEW.status) NOT IN ({moves}) THEN
            RAISE EXCEPTION 'jobs_status_moves: % -> % is not allowed', OLD.status, NEW.status
              USING ERRCODE = 'check_violation';
          END IF;
          RETURN NEW;
        END $$""")
        op.execute("DROP TRIGGER jobs_status_moves ON jobs")
        when = "WHEN (OLD.status IS DISTINCT FROM NEW.status) " if only_changes else ""
        op.execute(
            f"CREATE TRIGGER jobs_status_moves BEFORE UPDATE OF status ON jobs FOR EACH ROW {when}"
            "EXECUTE FUNCTION jobs_status_moves()"
        )
    else:
        op.execute("DROP TRIGGER jobs_status_moves")
        changed = "NEW.status IS NOT OLD.status AND " if only_changes else ""
        op.execute(f"""CREATE TRIGGER jobs_status_moves BEFORE UPDATE OF status ON jobs
        WHEN {changed}(OLD.status || '>' || NEW.status) NOT IN ({moves})
        BEGIN SELECT RAISE(ABORT, 'jobs_status_moves: this status move is not allowed'); END""")


def upgrade() -> None:
    _install(MOVES, only_changes=False)


def downgrade() -> None:
    _install(MOVES, only_changes=True)
