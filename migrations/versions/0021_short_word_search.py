"""Searches of one or two characters outside ASCII (東京, 猫) read an index: ``job_bigrams``.

Neither trigram index (SQLite's FTS5 ``jobs_search``, PostgreSQL's ``pg_trgm`` on ``job_search``) can find a
string shorter than three characters, so such a term was compared with every job: ``東京`` at 1,000,000 jobs
took 1.2 s on SQLite and 135 ms on PostgreSQL (bench/queries_bench.py). In scripts that write a word in one or
two characters these are words, not noise (short ASCII words are id prefixes only).

``job_bigrams`` holds, for each job whose searched text has a character outside ASCII, every distinct pair of
adjacent characters of that text that has one: the searched fields lower-cased, each on its own line, with a
line break before the first and after the last. A two-character term is then one key, and a one-character term
the range of keys starting with it (every character is followed by another or by a line break). Jobs in plain
ASCII get no rows: their submit pays one length comparison.

Kept by triggers beside the trigram index's, on the same writes (insert, a change of ``error``, delete). SQLite
keys the job by ``rowid`` as ``jobs_search`` does; its triggers cannot hold a ``WITH RECURSIVE`` and SQLite has no
built-in ``generate_series``, so the positions 0…n-1 of the text come from ``json_each`` over an array of n zeros.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: SQLite: the searched text of the row *p* (``new.`` or ``jobs.``); ``lower`` folds ASCII letters.
_SQLITE_TEXT = (
    "char(10) || lower({p}kind || char(10) || coalesce({p}resource_type, '') || char(10) || "
    "coalesce({p}resource_id, '') || char(10) || coalesce({p}summary, '') || char(10) || "
    "coalesce({p}error, '')) || char(10)"
)
#: SQLite: a row's searched fields run together.
_SQLITE_FIELDS = (
    "{p}kind || coalesce({p}resource_type, '') || coalesce({p}resource_id, '') || coalesce({p}summary, '') || "
    "coalesce({p}error, '')"
)
#: SQLite: whether a row's searched fields hold a character outside ASCII (more bytes than characters).
_SQLITE_WIDE = f"length(CAST({_SQLITE_FIELDS} AS BLOB)) > length({_SQLITE_FIELDS})"


def _sqlite_fill(p: str, source: str) -> str:
    """The rows of ``job_bigrams`` for the rows *p* (``new.``, or ``jobs.`` with *source* ``FROM jobs``) that
    hold a character outside ASCII."""
    return f"""INSERT OR IGNORE INTO job_bigrams (gram, job)
    SELECT pair.gram, pair.job FROM (
      SELECT substr(t.body, pos.key + 1, 2) AS gram, t.job AS job
      FROM (SELECT {p}rowid AS job, {_SQLITE_TEXT.format(p=p)} AS body {source}
            WHERE {_SQLITE_WIDE.format(p=p)}) AS t,
           json_each('[0' || replace(hex(zeroblob(length(t.body) - 2)), '00', ',0') || ']') AS pos
    ) AS pair
    WHERE length(CAST(pair.gram AS BLOB)) > 2"""


SQLITE = [
    """CREATE TABLE job_bigrams (
      gram TEXT NOT NULL,
      job INTEGER NOT NULL,
      CONSTRAINT pk_job_bigrams PRIMARY KEY (gram, job)
    ) WITHOUT ROWID""",
    "CREATE INDEX ix_job_bigrams_job ON job_bigrams (job)",
    # (the WHEN repeats the fill's own condition: a plain ASCII job's insert then runs no statement at all)
    f"""CREATE TRIGGER jobs_bigrams_insert AFTER INSERT ON jobs WHEN {_SQLITE_WIDE.format(p="new.")} BEGIN
    {_sqlite_fill("new.", "")}; END""",
    """CREATE TRIGGER jobs_bigrams_delete AFTER DELETE ON jobs BEGIN
    DELETE FROM job_bigrams WHERE job = old.rowid; END""",
    f"""CREATE TRIGGER jobs_bigrams_error AFTER UPDATE OF error ON jobs WHEN old.error IS NOT new.error BEGIN
    DELETE FROM job_bigrams WHERE job = old.rowid;
    {_sqlite_fill("new.", "")}; END""",
]

#: PostgreSQL: revision 0009's search text of a row, as that revision wrote it.
_PG_BODY = "lower(concat_ws(E'\\n', {p}kind, {p}resource_type, {p}resource_id, {p}summary, {p}error))"

#: The sync function of revision 0009, restored on downgrade.
_PG_SYNC_0009 = f"""CREATE OR REPLACE FUNCTION jobs_search_sync() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO job_search (job_id, body) VALUES (NEW.id, {_PG_BODY.format(p="NEW.")})
        ON CONFLICT (job_id) DO UPDATE SET body = EXCLUDED.body;
      RETURN NULL;
    END $$"""


def _pg_pairs(body: str) -> str:
    """The distinct pairs with a character outside ASCII of the search text *body*, framed by line breaks."""
    return f"""SELECT DISTINCT substr(E'\\n' || {body} || E'\\n', pos, 2) AS gram
      FROM generate_series(1, length({body}) + 1) AS pos"""


POSTGRESQL = [
    """CREATE TABLE job_bigrams (
      gram TEXT COLLATE "C" NOT NULL,
      job_id VARCHAR(32) NOT NULL,
      CONSTRAINT pk_job_bigrams PRIMARY KEY (gram, job_id),
      CONSTRAINT fk_job_bigrams_job_id_jobs FOREIGN KEY (job_id) REFERENCES jobs (id) ON DELETE CASCADE
    )""",
    "CREATE INDEX ix_job_bigrams_job_id ON job_bigrams (job_id)",
    f"""INSERT INTO job_bigrams (gram, job_id)
    SELECT pair.gram, s.job_id FROM job_search AS s,
      LATERAL ({_pg_pairs("s.body")}) AS pair
    WHERE octet_length(s.body) > length(s.body) AND octet_length(pair.gram) > 2""",
    f"""CREATE OR REPLACE FUNCTION jobs_search_sync() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
      body text := {_PG_BODY.format(p="NEW.")};
    BEGIN
      INSERT INTO job_search (job_id, body) VALUES (NEW.id, body)
        ON CONFLICT (job_id) DO UPDATE SET body = EXCLUDED.body;
      IF TG_OP = 'UPDATE' THEN
        DELETE FROM job_bigrams WHERE job_id = NEW.id;
      END IF;
      IF octet_length(body) > length(body) THEN
        INSERT INTO job_bigrams (gram, job_id)
        SELECT pair.gram, NEW.id FROM ({_pg_pairs("body")}) AS pair WHERE octet_length(pair.gram) > 2;
      END IF;
      RETURN NULL;
    END $$""",
]


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in POSTGRESQL:
            op.execute(statement)
        return
    for statement in SQLITE:
        op.execute(statement)
    op.execute(_sqlite_fill("jobs.", "FROM jobs"))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_SYNC_0009)
        op.execute("DROP TABLE job_bigrams")
        return
    for name in ("jobs_bigrams_error", "jobs_bigrams_delete", "jobs_bigrams_insert"):
        op.execute(f"DROP TRIGGER {name}")
    op.execute("DROP TABLE job_bigrams")
