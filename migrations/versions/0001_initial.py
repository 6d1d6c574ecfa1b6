"""Initial schema: the SQLite broker's tables and the job tables.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES = "'queued', 'running', 'succeeded', 'failed', 'cancelled', 'interrupted'"
TERMINAL = "'succeeded', 'failed', 'cancelled', 'interrupted'"


#: The SQLite broker's DDL (schema version 1) as it was when this revision was written: a revision is
#: frozen in time, so it holds its own copy rather than reading broker/schema.sql, which may move on
#: (a later broker schema change gets a revision of its own).
BROKER_SCHEMA_V1 = """
-- Tenure SQLite broker schema, version 1.
-- Owned by the broker: created on first use for standalone Dramatiq users, and replayed verbatim by the
-- Alembic migration that creates Tenure's database. Every statement is idempotent (IF NOT EXISTS).
--
-- broker_messages: one row per enqueued message (never keyed by Dramatiq's message_id, which repeats
-- when Retries re-enqueues a message that is still leased).
--   state 0 READY   : may run now (claims take them in priority, eta, id order)
--   state 1 LEASED  : held by lease_owner until lease_expires (ms epoch); renewed by the owner's heartbeat
--   state 2 DEAD    : dead letter, kept until dead_at + dead-letter TTL; replay moves it back to READY
--   state 3 DELAYED : native delay: becomes READY (inside a claim transaction) once eta <= now
-- Each index is partial on one state, so an immediate enqueue maintains only the READY index: every index
-- a row enters costs a WAL page per commit.
CREATE TABLE IF NOT EXISTS broker_messages (
    id            INTEGER PRIMARY KEY,
    queue         TEXT    NOT NULL,
    message_id    TEXT    NOT NULL,
    actor         TEXT    NOT NULL DEFAULT '',
    priority      INTEGER NOT NULL DEFAULT 0,
    eta           INTEGER NOT NULL,
    state         INTEGER NOT NULL DEFAULT 0 CHECK (state IN (0, 1, 2, 3)),
    lease_owner   TEXT,
    lease_expires INTEGER,
    deliveries    INTEGER NOT NULL DEFAULT 0 CHECK (deliveries >= 0),
    enqueued_at   INTEGER NOT NULL,
    dead_at       INTEGER,
    dead_reason   TEXT,
    body          BLOB    NOT NULL,
    CHECK ((state = 1) = (lease_owner IS NOT NULL AND lease_expires IS NOT NULL)),
    CHECK ((state = 1) OR (lease_owner IS NULL AND lease_expires IS NULL)),
    CHECK ((state = 2) = (dead_at IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS broker_messages_ready   ON broker_messages (queue, priority, eta, id) WHERE state = 0;
CREATE INDEX IF NOT EXISTS broker_messages_delayed ON broker_messages (queue, eta) WHERE state = 3;
CREATE INDEX IF NOT EXISTS broker_messages_leased  ON broker_messages (lease_expires) WHERE state = 1;
CREATE INDEX IF NOT EXISTS broker_messages_owner   ON broker_messages (lease_owner) WHERE state = 1;
CREATE INDEX IF NOT EXISTS broker_messages_dead    ON broker_messages (queue, dead_at) WHERE state = 2;

-- broker_queues: declared queues and their operator state (paused queues are skipped by claims).
CREATE TABLE IF NOT EXISTS broker_queues (
    name        TEXT PRIMARY KEY,
    paused      INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    declared_at INTEGER NOT NULL
) WITHOUT ROWID;

-- broker_processes: live consumer processes (lease owners). Their wake address lets producers nudge
-- idle consumers; rows whose heartbeat is older than the lease TTL are removed by the reaper.
CREATE TABLE IF NOT EXISTS broker_processes (
    owner        TEXT PRIMARY KEY,
    host         TEXT    NOT NULL,
    pid          INTEGER NOT NULL,
    wake_addr    TEXT,
    queues       TEXT    NOT NULL DEFAULT '',
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL
) WITHOUT ROWID;

-- broker_unclean_exits: consumer processes that ended without unregistering (SIGKILL, OOM, power loss).
-- The next process to start reports them once (how many, since when), then marks them reported.
CREATE TABLE IF NOT EXISTS broker_unclean_exits (
    owner             TEXT PRIMARY KEY,
    host              TEXT    NOT NULL,
    pid               INTEGER NOT NULL,
    started_at        INTEGER NOT NULL,
    last_heartbeat_at INTEGER NOT NULL,
    detected_at       INTEGER NOT NULL,
    reported_at       INTEGER
) WITHOUT ROWID;

-- broker_results: Dramatiq Results middleware backend (value is the encoded result).
CREATE TABLE IF NOT EXISTS broker_results (
    key        TEXT PRIMARY KEY,
    value      BLOB    NOT NULL,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS broker_results_expires ON broker_results (expires_at);

-- broker_rate_limits: Dramatiq rate limiter backend (counters, windows, barriers).
CREATE TABLE IF NOT EXISTS broker_rate_limits (
    key        TEXT PRIMARY KEY,
    value      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS broker_rate_limits_expires ON broker_rate_limits (expires_at);

-- broker_meta: schema version of the broker's tables.
CREATE TABLE IF NOT EXISTS broker_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO broker_meta (key, value) VALUES ('schema_version', '1');
"""


def _statements(script: str) -> list[str]:
    lines = [line for line in script.splitlines() if not line.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        # The broker's DDL (idempotent), so a job and its message live in one file. With
        # PostgreSQL the broker is Redis or RabbitMQ and these tables are not needed.
        for statement in _statements(BROKER_SCHEMA_V1):
            op.execute(statement)

    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("owner_id", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(200), nullable=False),
        sa.Column("actor_name", sa.String(200), nullable=False),
        sa.Column("queue_name", sa.String(200), nullable=False),
        sa.Column("resource_type", sa.String(100), nullable=True),
        sa.Column("resource_id", sa.String(200), nullable=True),
        sa.Column("idempotency_key", sa.String(200), nullable=True),
        sa.Column("request_digest", sa.String(64), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("config", sa.Text(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("timeout_s", sa.Integer(), nullable=False),
        sa.Column("safe_to_rerun", sa.Boolean(), nullable=False),
        sa.Column("worker_id", sa.String(200), nullable=True),
        sa.Column("lease_expires_at", sa.BigInteger(), nullable=True),
        sa.Column("run_after", sa.BigInteger(), nullable=False),
        sa.Column("progress", sa.Float(), nullable=True),
        sa.Column("progress_message", sa.Text(), nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("cancel_requested_at", sa.BigInteger(), nullable=True),
        sa.Column("event_seq", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=True),
        sa.Column("completed_at", sa.BigInteger(), nullable=True),
        sa.Column("retry_of_job_id", sa.String(32), nullable=True),
        sa.Column("parent_job_id", sa.String(32), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.ForeignKeyConstraint(["retry_of_job_id"], ["jobs.id"], name="fk_jobs_retry_of_job_id_jobs"),
        sa.ForeignKeyConstraint(["parent_job_id"], ["jobs.id"], name="fk_jobs_parent_job_id_jobs"),
        sa.CheckConstraint(f"status IN ({STATUSES})", name="ck_jobs_status_known"),
        sa.CheckConstraint(
            f"(status IN ({TERMINAL}) AND completed_at IS NOT NULL) "
            f"OR (status NOT IN ({TERMINAL}) AND completed_at IS NULL)",
            name="ck_jobs_terminal_has_completed_at",
        ),
        sa.CheckConstraint(
            "(status = 'running' AND worker_id IS NOT NULL AND lease_expires_at IS NOT NULL) "
            "OR (status <> 'running' AND worker_id IS NULL AND lease_expires_at IS NULL)",
            name="ck_jobs_running_has_lease",
        ),
        sa.CheckConstraint(
            "status <> 'queued' OR cancel_requested_at IS NULL", name="ck_jobs_queued_not_cancel_requested"
        ),
        sa.CheckConstraint(
            "attempt >= 0 AND attempt <= max_attempts AND max_attempts >= 1", name="ck_jobs_attempt_range"
        ),
        sa.CheckConstraint("timeout_s > 0", name="ck_jobs_timeout_positive"),
        sa.CheckConstraint("event_seq >= 0", name="ck_jobs_event_seq_positive"),
    )
    op.create_index("ix_jobs_owner_created", "jobs", ["owner_id", "created_at"])
    op.create_index("ix_jobs_status_lease", "jobs", ["status", "lease_expires_at"])
    op.create_index("ix_jobs_resource", "jobs", ["resource_type", "resource_id"])
    op.create_index("ix_jobs_parent", "jobs", ["parent_job_id"])
    op.create_index("ix_jobs_retry_of", "jobs", ["retry_of_job_id"])

    op.create_table(
        "job_events",
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "sequence", name="pk_job_events"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_events_job_id_jobs", ondelete="CASCADE"),
        sa.CheckConstraint("sequence >= 1", name="ck_job_events_sequence_positive"),
    )

    op.create_table(
        "idempotency",
        sa.Column("owner_id", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(200), nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("request_digest", sa.String(64), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("owner_id", "kind", "key", name="pk_idempotency"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_idempotency_job_id_jobs", ondelete="CASCADE"),
    )
    op.create_index("ix_idempotency_job", "idempotency", ["job_id"])

    op.create_table(
        "outbox",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("message_id", sa.String(64), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=True),
        sa.Column("queue_name", sa.String(200), nullable=False),
        sa.Column("actor_name", sa.String(200), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("eta", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("published_at", sa.BigInteger(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_outbox"),
        sa.UniqueConstraint("message_id", name="uq_outbox_message_id"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_outbox_job_id_jobs", ondelete="SET NULL"),
    )
    op.create_index("ix_outbox_pending", "outbox", ["published_at", "id"])

    op.create_table(
        "job_dependencies",
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("depends_on_job_id", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "depends_on_job_id", name="pk_job_dependencies"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_dependencies_job_id_jobs", ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["depends_on_job_id"], ["jobs.id"], name="fk_job_dependencies_depends_on_job_id_jobs", ondelete="CASCADE"
        ),
        sa.CheckConstraint("job_id <> depends_on_job_id", name="ck_job_dependencies_no_self_dependency"),
    )
    op.create_index("ix_job_dependencies_depends_on", "job_dependencies", ["depends_on_job_id"])


def downgrade() -> None:
    for table in ("job_dependencies", "outbox", "idempotency", "job_events", "jobs"):
        op.drop_table(table)
