"""Replaying every migration gives exactly the models' schema; start-up refuses unknown revisions."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect

from jobs import schema
from jobs.db import make_engine
from jobs.errors import SchemaMismatch
from jobs.models import metadata

ROOT = Path(__file__).resolve().parents[2]


#: The tables this suite owns; other layers' tables (accounts, schedules, …) have their own checks.
JOB_TABLES = frozenset(metadata.tables) & {
    "jobs",
    "job_events",
    "idempotency",
    "outbox",
    "job_dependencies",
    "retention_marks",
    "rate_starts",
    "live_feeds",
}


def _include(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
    table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
    return table in JOB_TABLES


@contextmanager
def _at_revision(backend: str, tmp_path: Path, revision: str) -> Iterator[tuple[str, Engine]]:
    """A fresh database of *backend* upgraded to *revision*: its URL and an engine on it."""
    from alembic import command

    from tests.integration.jobs.support import postgres_database

    database = nullcontext(f"sqlite:///{tmp_path / 'm.db'}") if backend == "sqlite" else postgres_database()
    with database as url:
        command.upgrade(schema.alembic_config(url), revision)
        engine = make_engine(url)
        try:
            yield url, engine
        finally:
            engine.dispose()


def test_migrations_equal_models(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    assert schema.upgrade(url) == schema.head_revision()
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"include_object": _include, "compare_type": True})
            assert compare_metadata(ctx, metadata) == []
            tables = set(inspect(conn).get_table_names())
        # the broker's own tables come from its DDL in the same migration
        assert {"broker_messages", "broker_queues", "jobs", "job_events", "idempotency", "outbox"} <= tables
        # CHECKs are not compared by autogenerate: compare their SQL text directly
        with sqlite3.connect(tmp_path / "m.db") as raw:
            ddl = raw.execute("SELECT sql FROM sqlite_master WHERE name = 'jobs'").fetchone()[0]
        for ck in metadata.tables["jobs"].constraints:
            if ck.__class__.__name__ == "CheckConstraint":
                assert str(ck.sqltext) in ddl
    finally:
        engine.dispose()


def test_upgrade_is_idempotent_and_check_passes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    schema.upgrade(url)
    schema.upgrade(url)
    engine = make_engine(url)
    assert schema.check_database_at_head(engine) == schema.head_revision()
    engine.dispose()


def test_unmigrated_database_is_refused(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'none.db'}")
    with pytest.raises(SchemaMismatch, match="tenure db upgrade"):
        schema.check_database_at_head(engine)
    assert not (tmp_path / "none.db").exists()


def test_the_written_out_heads_are_alembics() -> None:
    """``jobs.schema.HEADS`` lets a process confirm an up-to-date database without loading the migrations;
    a new migration must update it."""
    assert schema.HEADS == schema.head_revisions(), "a migration was added: update jobs.schema.HEADS"


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.services)])
def test_a_database_behind_is_refused_and_one_at_head_is_confirmed_without_alembic(
    tmp_path: Path, backend: str
) -> None:
    with _at_revision(backend, tmp_path, "0019") as (url, engine):
        with pytest.raises(SchemaMismatch, match=f"'0019', behind '{schema.head_revision()}'; run `tenure db upgrade`"):
            schema.check_database_at_head(engine)
        schema.upgrade(url)
        # A fresh process, as a worker starts: the check passes and never imports Alembic.
        check = (
            "import sys; from jobs.db import make_engine; from jobs.schema import check_database_at_head; "
            f"print(check_database_at_head(make_engine({url!r}))); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))"
        )
        run = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        assert run.stdout.split("\n")[:2] == [schema.head_revision(), "[]"]


def _at_future_revision(path: Path) -> str:
    schema.upgrade(f"sqlite:///{path}")
    with sqlite3.connect(path) as raw:
        raw.execute("DELETE FROM alembic_version")
        raw.execute("INSERT INTO alembic_version (version_num) VALUES ('9999_from_the_future')")
    raw.close()
    with sqlite3.connect(path) as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw.close()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_newer_revision_is_refused_and_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    digest = _at_future_revision(path)
    engine = make_engine(f"sqlite:///{path}")
    with pytest.raises(SchemaMismatch, match="does not know"):
        schema.check_database_at_head(engine)
    engine.dispose()
    with pytest.raises(SchemaMismatch, match="does not know"):
        schema.upgrade(f"sqlite:///{path}")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_cli_upgrade_and_refusal(tmp_path: Path) -> None:
    path = tmp_path / "cli.db"
    env = {"TENURE_DATABASE_URL": f"sqlite:///{path}", "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [sys.executable, "-m", "tenure_cli", "db", "upgrade"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert "revision" in run.stdout
    digest = _at_future_revision(path)
    run = subprocess.run(
        [sys.executable, "-m", "tenure_cli", "db", "upgrade"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert run.returncode == 1
    assert "does not know" in run.stderr
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_revision_0001_holds_the_broker_schema_it_was_written_for() -> None:
    """Revision 0001 carries its own copy of the broker's DDL: equal to broker/schema.sql while the
    broker's schema version is still 1 (a new version needs a revision of its own)."""
    import importlib.util

    import broker
    from broker.store import SCHEMA_VERSION

    spec = importlib.util.spec_from_file_location("rev0001", ROOT / "migrations" / "versions" / "0001_initial.py")
    assert spec and spec.loader
    rev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rev)
    assert SCHEMA_VERSION == 1, "the broker schema moved on: add a revision that applies it, then update this test"
    assert rev._statements(rev.BROKER_SCHEMA_V1) == rev._statements(broker.schema_sql())


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.services)])
def test_revision_0018_gives_existing_events_their_owner(tmp_path: Path, backend: str) -> None:
    """Events written before revision 0018 get their job's owner (a user's feed reads them by owner), and
    the revision's accounts tables are what accounts' metadata says."""
    from sqlalchemy import text

    import accounts.session_store  # noqa: F401  (their tables join accounts' metadata)
    import accounts.slot_store  # noqa: F401
    from accounts.store import metadata as accounts_metadata

    with _at_revision(backend, tmp_path, "0016") as (url, engine):
        with engine.begin() as conn:
            for job_id, owner in (("j1", "7"), ("j2", "scheduler")):
                conn.execute(
                    text(
                        "INSERT INTO jobs (id, owner_id, kind, actor_name, queue_name, request_digest, payload, "
                        "config, priority, status, attempt, max_attempts, timeout_s, safe_to_rerun, run_after, "
                        "event_seq, created_at, updated_at) VALUES (:id, :owner, 'k', 'a', 'q', 'd', '{}', '{}', "
                        "0, 'queued', 0, 1, 60, :safe, 0, 1, 0, 0)"
                    ),
                    {"id": job_id, "owner": owner, "safe": True},
                )
                conn.execute(
                    text(
                        "INSERT INTO job_events (job_id, sequence, type, data, created_at) "
                        "VALUES (:id, 1, 'status', '{}', 0)"
                    ),
                    {"id": job_id},
                )
        assert schema.upgrade(url) == schema.head_revision()
        with engine.connect() as conn:
            owners = dict(conn.execute(text("SELECT job_id, owner_id FROM job_events")).all())

            def only_new(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
                table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
                return table in ("login_sessions", "live_slots")

            ctx = MigrationContext.configure(conn, opts={"compare_type": True, "include_object": only_new})
            assert compare_metadata(ctx, accounts_metadata) == []
    assert owners == {"j1": "7", "j2": "scheduler"}


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.services)])
def test_revision_0021_indexes_the_short_words_of_existing_jobs_and_goes_back(tmp_path: Path, backend: str) -> None:
    """Jobs written before revision 0021 get their pairs of characters outside ASCII in ``job_bigrams``; its
    downgrade leaves the search triggers of 0020 working."""
    from alembic import command
    from sqlalchemy import text

    insert = text(
        "INSERT INTO jobs (id, owner_id, kind, actor_name, queue_name, resource_id, request_digest, payload, config, "
        "priority, status, attempt, max_attempts, timeout_s, safe_to_rerun, run_after, event_seq, created_at, "
        "updated_at) VALUES (:id, 'u', 'k', 'a', 'q', :resource, 'd', '{}', '{}', 0, 'queued', 0, 1, 60, :safe, 0, 1, "
        ":at, :at)"
    )
    job = "job" if backend == "sqlite" else "job_id"
    rowid = "rowid" if backend == "sqlite" else "id"
    pairs = text(f"SELECT j.id, b.gram FROM job_bigrams AS b JOIN jobs AS j ON j.{rowid} = b.{job} ORDER BY 1, 2")
    with _at_revision(backend, tmp_path, "0020") as (url, engine):
        with engine.begin() as conn:
            for n, resource in enumerate(("東京", "tokyo")):
                conn.execute(insert, {"id": f"j{n}", "resource": resource, "safe": True, "at": n})
        assert schema.upgrade(url) == schema.head_revision()
        with engine.connect() as conn:
            assert [tuple(r) for r in conn.execute(pairs)] == [("j0", "\n東"), ("j0", "京\n"), ("j0", "東京")]
        command.downgrade(schema.alembic_config(url), "0020")
        with engine.begin() as conn:
            assert "job_bigrams" not in inspect(conn).get_table_names()
            conn.execute(insert, {"id": "j2", "resource": "猫", "safe": True, "at": 2})
            conn.execute(text("UPDATE jobs SET error = 'x' WHERE id = 'j2'"))
            conn.execute(text("DELETE FROM jobs WHERE id = 'j2'"))


def _pgbroker_catalog(url: str) -> dict[str, list[str]]:
    """The PostgreSQL broker's columns, indexes, constraints and triggers as the catalog describes them."""
    import psycopg

    from broker.postgres import parse_postgres_url

    with psycopg.connect(parse_postgres_url(url).conninfo) as conn:

        def rows(sql: str) -> list[str]:
            return sorted(" ".join(map(str, r)) for r in conn.execute(sql))

        return {
            "columns": rows(
                "SELECT table_name, column_name, data_type, is_nullable, column_default, is_identity "
                "FROM information_schema.columns WHERE table_name LIKE 'pgbroker%'"
            ),
            "indexes": rows("SELECT indexname, indexdef FROM pg_indexes WHERE tablename LIKE 'pgbroker%'"),
            "checks": rows(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'pgbroker_messages'::regclass"
            ),
            "triggers": rows("SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname LIKE 'pgbroker%'"),
            "meta": rows("SELECT key, value FROM pgbroker_meta"),
        }


@pytest.mark.services
def test_revision_0022_creates_the_postgres_brokers_tables_as_the_broker_does_and_goes_back(tmp_path: Path) -> None:
    """The frozen copy in revision 0022 is the broker's own schema version 1: a database migrated to head and
    one where the broker created its tables on first use have the same columns, indexes, checks and trigger."""
    from alembic import command

    from broker.postgres import PostgresBroker
    from tests.integration.jobs.support import postgres_database

    with _at_revision("postgres", tmp_path, "head") as (url, engine):
        migrated = _pgbroker_catalog(url)
        assert migrated["meta"] == ["schema_version 1"]
        assert any("pgbroker_messages_ready" in i for i in migrated["indexes"])
        command.downgrade(schema.alembic_config(url), "0021")
        with engine.connect() as conn:
            assert not [t for t in inspect(conn).get_table_names() if t.startswith("pgbroker")]
    with postgres_database() as url:
        broker = PostgresBroker(url)
        try:
            broker.ensure_schema()
        finally:
            broker.close()
        assert _pgbroker_catalog(url) == migrated


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_revision_0023_indexes_one_owners_jobs_by_status_on_postgresql_only_and_goes_back(
    tmp_path: Path, backend: str
) -> None:
    """PostgreSQL gets ``ix_jobs_owner_status_created`` (owner, status, newest first); SQLite, whose status
    changes would pay for it in every claim and completion, is left as it was."""
    from alembic import command

    with _at_revision(backend, tmp_path, "head") as (url, engine):

        def columns() -> list[str] | None:
            with engine.connect() as conn:
                found = [i for i in inspect(conn).get_indexes("jobs") if i["name"] == "ix_jobs_owner_status_created"]
            return found[0]["column_names"] if found else None

        assert columns() == (["owner_id", "status", "created_at", "id"] if backend == "postgres" else None)
        command.downgrade(schema.alembic_config(url), "0022")
        assert columns() is None
        command.upgrade(schema.alembic_config(url), "head")
        assert columns() == (["owner_id", "status", "created_at", "id"] if backend == "postgres" else None)
