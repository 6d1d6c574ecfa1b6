"""Alembic environment: migrates the database named by Tenure's Settings (or a given connection)."""

from __future__ import annotations

from alembic import context

from jobs.db import make_engine
from jobs.models import metadata
from settings.environment import Settings

config = context.config
target_metadata = metadata


def _include_object(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
    # The broker's tables come from its own DDL (broker/schema.sql), not from the job models.
    if type_ == "table" and name is not None and name.startswith("broker_"):
        return False
    if type_ == "index" and name is not None and name.startswith("broker_"):
        return False
    return True


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or Settings.from_env().database_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_object=_include_object,
        render_as_batch=connection.dialect.name == "sqlite",
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
