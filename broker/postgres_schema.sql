-- Tenure PostgreSQL broker schema, version 1 (PostgreSQL 14 or newer).
-- Owned by the broker: created on first use for standalone Dramatiq users. Alembic revision 0022 holds a
-- frozen copy of version 1 (a change here needs a revision of its own). Every statement is idempotent.
--
-- pgbroker_messages: one row per enqueued message, in the states of the SQLite broker (schema.sql):
--   0 READY, 1 LEASED (lease_owner until lease_expires, ms epoch), 2 DEAD, 3 DELAYED (READY once eta <= now).
-- Claims lock READY rows with FOR UPDATE SKIP LOCKED, so consumers on any number of hosts never wait for
-- each other's rows. Each index is partial on one state: an immediate enqueue maintains the READY index only.
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

-- A row that becomes READY or DELAYED wakes the consumers of its queue when its transaction commits
-- (NOTIFY is transactional: a rolled-back enqueue wakes nobody; one notification per queue per transaction).
CREATE OR REPLACE FUNCTION pgbroker_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tenure_pgbroker', NEW.queue);
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER pgbroker_messages_notify
    AFTER INSERT OR UPDATE OF state ON pgbroker_messages
    FOR EACH ROW WHEN (NEW.state IN (0, 3)) EXECUTE FUNCTION pgbroker_notify();

-- pgbroker_meta: schema version of the broker's tables.
CREATE TABLE IF NOT EXISTS pgbroker_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT INTO pgbroker_meta (key, value) VALUES ('schema_version', '1') ON CONFLICT (key) DO NOTHING;
