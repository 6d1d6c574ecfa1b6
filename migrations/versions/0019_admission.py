"""Admission: per-key concurrency and rate limits, and jobs that wait for their message.

``jobs`` gains:

- ``concurrency_key`` / ``rate_key``: the job's keys under its kind's limits (``<limit name>=<value>``),
  computed at submit; NULL when the job is not limited.
- ``held`` / ``held_on``: a queued job waiting for admission has no broker message yet; ``held`` says
  why (``queue``: its queue's fair-share window is full; ``concurrency`` / ``rate``: its key is at its
  limit; ``steps``: a workflow step waits for its dependencies) and ``held_on`` what it waits on (the
  queue name, the key or the workflow). The CHECK keeps both on queued
  jobs only, so a status move out of ``queued`` clears them in the same UPDATE.

Indexes (all partial, so jobs outside them cost nothing): ``ix_jobs_held`` (held jobs in the order
admission takes them: per owner, priority, then age), ``ix_jobs_inflight`` (admitted and running jobs
per queue and owner: the window and the fair-share counts), ``ix_jobs_concurrency_active`` and
``ix_jobs_rate_active`` (what a key has running or admitted).

``rate_starts`` logs the starts of rate-limited jobs (the sliding window a rate limit counts).

On PostgreSQL, a statement trigger on ``outbox`` sends ``NOTIFY tenure_outbox``: the relay publishes a
job's message when the transaction that wrote it commits instead of at its next poll. Workflow steps
already waiting for their dependencies are marked ``held = 'steps'``.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

HELD_CHECK = (
    "held IS NULL OR (status = 'queued' AND held IN ('queue', 'concurrency', 'rate', 'steps') AND held_on IS NOT NULL)"
)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("concurrency_key", sa.String(200), nullable=True))
    op.add_column("jobs", sa.Column("rate_key", sa.String(200), nullable=True))
    op.add_column("jobs", sa.Column("held_on", sa.String(200), nullable=True))
    if op.get_bind().dialect.name == "sqlite":
        # SQLite adds a CHECK only with its column (a table constraint would need the table rebuilt).
        op.execute(f"ALTER TABLE jobs ADD COLUMN held VARCHAR(16) CONSTRAINT ck_jobs_held_waiting CHECK ({HELD_CHECK})")
    else:
        op.add_column("jobs", sa.Column("held", sa.String(16), nullable=True))
        op.create_check_constraint("ck_jobs_held_waiting", "jobs", HELD_CHECK)
    op.create_index(
        "ix_jobs_held",
        "jobs",
        ["held", "held_on", "owner_id", sa.text("priority DESC"), "run_after", "created_at", "id"],
        sqlite_where=sa.text("held IS NOT NULL"),
        postgresql_where=sa.text("held IS NOT NULL"),
    )
    active = "held IS NULL AND status IN ('queued', 'running')"
    op.create_index(
        "ix_jobs_inflight",
        "jobs",
        ["queue_name", "owner_id", "status", "run_after", "held"],
        sqlite_where=sa.text(active),
        postgresql_where=sa.text(active),
    )
    op.create_index(
        "ix_jobs_concurrency_active",
        "jobs",
        ["concurrency_key", "owner_id", "status", "run_after", "held"],
        sqlite_where=sa.text(f"concurrency_key IS NOT NULL AND {active}"),
        postgresql_where=sa.text(f"concurrency_key IS NOT NULL AND {active}"),
    )
    op.create_index(
        "ix_jobs_rate_active",
        "jobs",
        ["rate_key", "owner_id", "status", "held"],
        sqlite_where=sa.text(f"rate_key IS NOT NULL AND {active}"),
        postgresql_where=sa.text(f"rate_key IS NOT NULL AND {active}"),
    )
    op.create_table(
        "rate_starts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_rate_starts"),
    )
    op.create_index("ix_rate_starts_key_started_at", "rate_starts", ["key", "started_at"])
    if op.get_bind().dialect.name == "postgresql":
        # Relays LISTEN on tenure_outbox: a transaction that wrote outbox rows wakes them when it commits
        # (PostgreSQL sends one notification per channel and transaction, however many rows it wrote).
        op.execute(
            "CREATE FUNCTION tenure_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_notify('tenure_outbox', ''); RETURN NULL; END $$"
        )
        op.execute(
            "CREATE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT "
            "EXECUTE FUNCTION tenure_outbox_notify()"
        )
    # Workflow steps queued before this revision that wait for their dependencies wait as such now.
    op.execute(
        "UPDATE jobs SET held = 'steps', held_on = parent_job_id WHERE status = 'queued' "
        "AND parent_job_id IS NOT NULL AND EXISTS (SELECT 1 FROM job_dependencies d "
        "JOIN jobs dep ON dep.id = d.depends_on_job_id WHERE d.job_id = jobs.id AND dep.status <> 'succeeded')"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS outbox_notify ON outbox")
        op.execute("DROP FUNCTION IF EXISTS tenure_outbox_notify()")
    op.execute("UPDATE jobs SET held = NULL, held_on = NULL WHERE held IS NOT NULL")
    op.drop_index("ix_rate_starts_key_started_at", table_name="rate_starts")
    op.drop_table("rate_starts")
    for name in ("ix_jobs_rate_active", "ix_jobs_concurrency_active", "ix_jobs_inflight", "ix_jobs_held"):
        op.drop_index(name, table_name="jobs")
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint("ck_jobs_held_waiting", "jobs", type_="check")
    for column in ("held", "held_on", "rate_key", "concurrency_key"):
        op.drop_column("jobs", column)
