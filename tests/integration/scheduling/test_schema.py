"""The Alembic revision creates exactly the tables the schedule store describes."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from jobs.db import make_engine
from jobs.schema import upgrade
from tasks.scheduling.store import metadata


def test_migrated_schedule_tables_match_the_store(sqlite_url: str) -> None:
    upgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "include_object": lambda obj, name, type_, reflected, compare_to: (
                        type_ != "table" or name in metadata.tables
                    ),
                },
            )
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()
