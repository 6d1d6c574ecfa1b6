"""The database schema's revision: upgrade it, and refuse to run against one this code does not know.

Alembic (``migrations/``) owns every table. ``check_database_at_head`` is read-only: on SQLite it
opens the file with ``mode=ro`` so that a refused database is left byte-identical.

Alembic is imported only where it is needed. Loading its script directory costs a process ~0.25 s
(its modules and every migration's), and every worker, relay and web process checks the revision
at start: a database already at :data:`HEADS` is confirmed without it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, inspect, text

from .errors import SchemaMismatch

if TYPE_CHECKING:
    from alembic.config import Config

#: The Alembic environment shipped with Tenure.
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"

#: The head revision(s) of ``migrations/``, written out so that a database at exactly these is confirmed
#: without loading the migrations; any other database is judged by Alembic's script directory. A new
#: migration must update it: ``tests/migration`` fails while it differs from Alembic's heads.
HEADS = frozenset({"0023"})


def alembic_config(url: str | None = None) -> Config:
    """An Alembic Config for Tenure's migrations (URL: *url*, else ``TENURE_DATABASE_URL``)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revisions() -> frozenset[str]:
    """The newest revision of every branch (parallel branches are allowed and all applied)."""
    from alembic.script import ScriptDirectory

    return frozenset(ScriptDirectory.from_config(alembic_config()).get_heads())


def head_revision() -> str:
    """The head revisions as one string (sorted, ``+``-joined when there are several branches)."""
    return "+".join(sorted(head_revisions()))


def known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def current_revisions(engine: Engine) -> frozenset[str]:
    """The revisions recorded in the database (empty: not migrated yet), read without writing."""
    path = engine.url.database if engine.dialect.name == "sqlite" else None
    if path is not None:
        if not Path(path).exists():
            return frozenset()
        conn = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
        try:
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
            ).fetchone()
            rows = conn.execute("SELECT version_num FROM alembic_version").fetchall() if exists else []
        finally:
            conn.close()
        return frozenset(r[0] for r in rows)
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return frozenset()
        return frozenset(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())


def check_database_at_head(engine: Engine) -> str:
    """Refuse to run against a database that is not at this code's head revision(s).

    Parameters:
      engine: The job database. Nothing is written to it.

    Raises:
      SchemaMismatch: Not migrated, behind (run ``tenure db upgrade``), or at a revision this code
        does not know (a newer Tenure migrated it: upgrade Tenure, do not run this one against it).

    Returns:
      The head revision(s).
    """
    current = current_revisions(engine)
    if current == HEADS:
        return "+".join(sorted(HEADS))
    where = engine.url.render_as_string(hide_password=True)
    if current == head_revisions():
        return head_revision()
    if not current:
        raise SchemaMismatch(f"{where} has no Tenure schema yet; run `tenure db upgrade` first")
    unknown = sorted(current - known_revisions())
    if unknown:
        raise SchemaMismatch(
            f"{where} is at schema revision {'+'.join(unknown)!r}, which this version of Tenure does not know "
            f"(its newest is {head_revision()!r}). It was probably migrated by a newer Tenure: upgrade this "
            "installation. The database was left untouched."
        )
    raise SchemaMismatch(
        f"{where} is at schema revision {'+'.join(sorted(current))!r}, behind {head_revision()!r}; "
        "run `tenure db upgrade`"
    )


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
        if current_revisions(engine) - known_revisions():
            check_database_at_head(engine)  # raises the explanatory error; nothing was written
        cfg = alembic_config(url)
        with engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "heads")
            conn.commit()
    finally:
        engine.dispose()
    return head_revision()
