"""The database schema's revision: upgrade it, and refuse to run against one this code does not know.

Alembic (``migrations/``) owns every table. ``check_database_at_head`` is read-only: on SQLite it
opens the file with ``mode=ro`` so that a refused database is left byte-identical.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from .errors import SchemaMismatch

#: The Alembic environment shipped with Tenure.
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(url: str | None = None) -> Config:
    """An Alembic Config for Tenure's migrations (URL: *url*, else ``TENURE_DATABASE_URL``)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise SchemaMismatch(f"the migrations have {len(heads)} heads; expected one")
    return heads[0]


def known_revisions() -> set[str]:
    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def current_revision(engine: Engine) -> str | None:
    """The revision recorded in the database (None: not migrated yet), read without writing."""
    path = engine.url.database if engine.dialect.name == "sqlite" else None
    if path is not None:
        if not Path(path).exists():
            return None
        conn = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
        try:
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
            ).fetchone()
            if not exists:
                return None
            rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        finally:
            conn.close()
        if len(rows) > 1:
            raise SchemaMismatch(f"{path} records {len(rows)} schema revisions; expected one")
        return rows[0][0] if rows else None
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def check_database_at_head(engine: Engine) -> str:
    """Refuse to run against a database that is not at this code's head revision.

    Parameters:
      engine: The job database. Nothing is written to it.

    Raises:
      SchemaMismatch: Not migrated, behind (run ``tenure db upgrade``), or at a revision this code
        does not know (a newer Tenure migrated it: upgrade Tenure, do not run this one against it).

    Returns:
      The head revision.
    """
    head = head_revision()
    current = current_revision(engine)
    where = engine.url.render_as_string(hide_password=True)
    if current == head:
        return head
    if current is None:
        raise SchemaMismatch(f"{where} has no Tenure schema yet; run `tenure db upgrade` first")
    if current not in known_revisions():
        raise SchemaMismatch(
            f"{where} is at schema revision {current!r}, which this version of Tenure does not know (its newest "
            f"is {head!r}). It was probably migrated by a newer Tenure: upgrade this installation. "
            "The database was left untouched."
        )
    raise SchemaMismatch(f"{where} is at schema revision {current!r}, behind {head!r}; run `tenure db upgrade`")


def upgrade(url: str) -> str:
    """Migrate the database at *url* to the head revision (creating it if needed).

    Raises:
      SchemaMismatch: The database is at a revision this code does not know (left untouched).

    Returns:
      The head revision.
    """
    from alembic import command

    from .db import make_engine

    engine = make_engine(url)
    try:
        current = current_revision(engine)
        if current is not None and current not in known_revisions():
            check_database_at_head(engine)  # raises the explanatory error
        cfg = alembic_config(url)
        with engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()
    finally:
        engine.dispose()
    return head_revision()
