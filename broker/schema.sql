-- Tenure SQLite broker schema, version 1.
-- Owned by the broker: created on first use for standalone Dramatiq users. Alembic revision 0001 holds a
-- frozen copy of version 1 (a change here needs a revision of its own). Every statement is idempotent.
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
