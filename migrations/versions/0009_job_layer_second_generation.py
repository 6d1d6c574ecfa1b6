"""The job layer's second generation: summaries, search, the database-enforced status machine, the
PostgreSQL change cursor.

- ``jobs.summary``: the kind's short description of a job (its folder, its clip window), written at
  submit; shown in lists and searched. Workflow parents are on the queue ``workflow`` (they were on
  ``''``), as the kinds say.
- ``jobs_status_moves``: a trigger that refuses any status change not in ``jobs.status.ALLOWED``, so no
  statement — the job layer's or a hand-written one — can make an illegal move.
- Text search over kind, resource, summary and error text, case-insensitive substrings:
  SQLite: ``jobs_search``, an FTS5 index with the trigram tokenizer over those columns of ``jobs``
  (external content: it stores only the index), kept in step by triggers on insert, delete and a
  change of ``error``; PostgreSQL: ``job_search`` (one lower-cased line per job) with a ``pg_trgm``
  GIN index, kept by a trigger. Neither touches the claim path: claims change none of those columns.
- The live feed's change cursor on PostgreSQL: ``job_events.change_xid`` (the writing transaction's id)
  and ``change_id`` (a sequence), indexed together. A reader returns only events of transactions older
  than every transaction still running (``pg_snapshot_xmin``), ordered by (xid, id): nothing can later
  commit behind a cursor, so resuming is gap-free and duplicate-free. SQLite keeps using ``rowid``
  (one writer at a time: rowid order is commit order); there both columns stay NULL.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The allowed status moves (from>to), as jobs/status.py's ALLOWED was when this revision was written.
MOVES = (
    "'queued>running', 'queued>cancelled', 'queued>failed', 'running>succeeded', 'running>failed', "
    "'running>cancelled', 'running>queued', 'running>interrupted'"
)
SEARCHED = "kind, resource_type, resource_id, summary, error"

SQLITE = [
    f"""CREATE TRIGGER jobs_status_moves BEFORE UPDATE OF status ON jobs
    WHEN NEW.status IS NOT OLD.status AND (OLD.status || '>' || NEW.status) NOT IN ({MOVES})
    BEGIN SELECT RAISE(ABORT, 'jobs_status_moves: this status move is not allowed'); END""",
    f"""CREATE VIRTUAL TABLE jobs_search USING fts5({SEARCHED}, content='jobs', content_rowid='rowid',
    tokenize='trigram')""",
    "INSERT INTO jobs_search(jobs_search) VALUES ('rebuild')",
    f"""CREATE TRIGGER jobs_search_insert AFTER INSERT ON jobs BEGIN
    INSERT INTO jobs_search(rowid, {SEARCHED})
    VALUES (new.rowid, new.kind, new.resource_type, new.resource_id, new.summary, new.error); END""",
    f"""CREATE TRIGGER jobs_search_delete AFTER DELETE ON jobs BEGIN
    INSERT INTO jobs_search(jobs_search, rowid, {SEARCHED})
    VALUES ('delete', old.rowid, old.kind, old.resource_type, old.resource_id, old.summary, old.error); END""",
    f"""CREATE TRIGGER jobs_search_error AFTER UPDATE OF error ON jobs WHEN old.error IS NOT new.error BEGIN
    INSERT INTO jobs_search(jobs_search, rowid, {SEARCHED})
    VALUES ('delete', old.rowid, old.kind, old.resource_type, old.resource_id, old.summary, old.error);
    INSERT INTO jobs_search(rowid, {SEARCHED})
    VALUES (new.rowid, new.kind, new.resource_type, new.resource_id, new.summary, new.error); END""",
]

#: One lower-cased line per searched field: a substring never spans two fields.
PG_BODY = "lower(concat_ws(E'\\n', {p}kind, {p}resource_type, {p}resource_id, {p}summary, {p}error))"

POSTGRESQL = [
    f"""CREATE FUNCTION jobs_status_moves() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF (OLD.status || '>' || NEW.status) NOT IN ({MOVES}) THEN
        RAISE EXCEPTION 'jobs_status_moves: % -> % is not allowed', OLD.status, NEW.status
          USING ERRCODE = 'check_violation';
      END IF;
      RETURN NEW;
    END $$""",
    """CREATE TRIGGER jobs_status_moves BEFORE UPDATE OF status ON jobs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION jobs_status_moves()""",
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    """CREATE TABLE job_search (
      job_id VARCHAR(32) NOT NULL,
      body TEXT NOT NULL,
      CONSTRAINT pk_job_search PRIMARY KEY (job_id),
      CONSTRAINT fk_job_search_job_id_jobs FOREIGN KEY (job_id) REFERENCES jobs (id) ON DELETE CASCADE
    )""",
    f"INSERT INTO job_search (job_id, body) SELECT id, {PG_BODY.format(p='')} FROM jobs",
    "CREATE INDEX ix_job_search_body ON job_search USING gin (body gin_trgm_ops)",
    f"""CREATE FUNCTION jobs_search_sync() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO job_search (job_id, body) VALUES (NEW.id, {PG_BODY.format(p="NEW.")})
        ON CONFLICT (job_id) DO UPDATE SET body = EXCLUDED.body;
      RETURN NULL;
    END $$""",
    """CREATE TRIGGER jobs_search_insert AFTER INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION jobs_search_sync()""",
    """CREATE TRIGGER jobs_search_error AFTER UPDATE OF error ON jobs FOR EACH ROW
    WHEN (OLD.error IS DISTINCT FROM NEW.error) EXECUTE FUNCTION jobs_search_sync()""",
    "CREATE SEQUENCE job_events_change_id_seq",
    "UPDATE job_events SET change_xid = 0, change_id = nextval('job_events_change_id_seq')",
    "ALTER TABLE job_events ALTER COLUMN change_xid SET DEFAULT (pg_current_xact_id()::text::bigint)",
    "ALTER TABLE job_events ALTER COLUMN change_id SET DEFAULT nextval('job_events_change_id_seq')",
    "CREATE INDEX ix_job_events_change ON job_events (change_xid, change_id)",
]


def upgrade() -> None:
    op.add_column("jobs", sa.Column("summary", sa.String(200), nullable=True))
    op.add_column("job_events", sa.Column("change_xid", sa.BigInteger(), nullable=True))
    op.add_column("job_events", sa.Column("change_id", sa.BigInteger(), nullable=True))
    op.execute("UPDATE jobs SET queue_name = 'workflow' WHERE actor_name = '' AND queue_name = ''")
    for statement in POSTGRESQL if op.get_bind().dialect.name == "postgresql" else SQLITE:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in (
            "DROP INDEX ix_job_events_change",
            "DROP TRIGGER jobs_search_error ON jobs",
            "DROP TRIGGER jobs_search_insert ON jobs",
            "DROP FUNCTION jobs_search_sync()",
            "DROP TABLE job_search",
            "DROP TRIGGER jobs_status_moves ON jobs",
            "DROP FUNCTION jobs_status_moves()",
        ):
            op.execute(statement)
    else:
        for name in ("jobs_search_error", "jobs_search_delete", "jobs_search_insert", "jobs_status_moves"):
            op.execute(f"DROP TRIGGER {name}")
        op.execute("DROP TABLE jobs_search")
    op.execute("UPDATE jobs SET queue_name = '' WHERE actor_name = '' AND queue_name = 'workflow'")
    op.drop_column("job_events", "change_id")
    op.drop_column("job_events", "change_xid")
    op.drop_column("jobs", "summary")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP SEQUENCE job_events_change_id_seq")
