"""The PostgreSQL broker's tables (``TENURE_BROKER_URL=postgresql://…``, the job database's own URL).

A frozen copy of ``broker/postgres_schema.sql`` version 1, as revision 0001 holds the SQLite broker's: the
broker creates the same tables on first use for standalone Dramatiq users, and every statement is idempotent,
so either may come first. PostgreSQL only; on SQLite this revision does nothing (the SQLite broker has its own
tables since 0001).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0022"
down_revision: str | Sequence[str] | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Advisory lock of the broker's own schema creation (``broker.postgres_store.SCHEMA_LOCK_KEY``).
_SCHEMA_LOCK_KEY = 0x7465_6E75_7265_0001

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pgbroker_messages (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue         TEXT     NOT NULL,
    message_id    TEXT     NOT NULL,
    actor         TEXT     NOT NULL DEFAULT '',
    priority      INTEGER  NOT NULL DEFAULT 0,
    eta           BIGINT   NOT NULL,
    state         SMALLINT NOT NULL DEFAULT 0 CHECK (state IN (0, 1, 2, 3)),
    lease_owner   TEXT,
    lease_expires BIGINT,
    deliveries    INTEGER  NOT NULL DEFAULT 0 CHECK (deliveries >= 0),
    enqueued_at   BIGINT   NOT NULL,
    dead_at       BIGINT,
    dead_reason   TEXT,
    body          BYTEA    NOT NULL,
    CHECK ((state = 1) = (lease_owner IS NOT NULL AND lease_expires IS NOT NULL)),
    CHECK ((state = 1) OR (lease_owner IS NULL AND lease_expires IS NULL)),
    CHECK ((state = 2) = (dead_at IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS pgbroker_messages_ready   ON pgbroker_messages (queue, priority, eta, id) WHERE state = 0;
CREATE INDEX IF NOT EXISTS pgbroker_messages_delayed ON pgbroker_messages (queue, eta) WHERE state = 3;
CREATE INDEX IF NOT EXISTS pgbroker_messages_leased  ON pgbroker_messages (lease_expires) WHERE state = 1;
CREATE INDEX IF NOT EXISTS pgbroker_messages_dead    ON pgbroker_messages (queue, dead_at) WHERE state = 2;

CREATE OR REPLACE FUNCTION pgbroker_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tenure_pgbroker', NEW.queue);
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER pgbroker_messages_notify
    AFTER INSERT OR UPDATE OF state ON pgbroker_messages
    FOR EACH ROW WHEN (NEW.state IN (0, 3)) EXECUTE FUNCTION pgbroker_notify();

CREATE TABLE IF NOT EXISTS pgbroker_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT INTO pgbroker_meta (key, value) VALUES ('schema_version', '1') ON CONFLICT (key) DO NOTHING;
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK_KEY})")
    op.execute(_SCHEMA)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TABLE IF EXISTS pgbroker_messages")
    op.execute("DROP FUNCTION IF EXISTS pgbroker_notify()")
    op.execute("DROP TABLE IF EXISTS pgbroker_meta")
