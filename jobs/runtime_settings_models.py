"""The ``runtime_settings`` table: one row per saved batch of runtime settings (append-only history).

Revision ``0005_runtime_settings`` creates it; this declaration mirrors it (tests compare both). The
table lives on the job layer's metadata, like the accounts tables, so Alembic's environment sees it.

- ``revision``: 1, 2, 3, … — the primary key, so two admins saving on the same revision cannot both
  insert ``revision + 1`` (the second gets a conflict, whatever the database).
- ``saved_at``: integer milliseconds since the epoch (UTC), as in every other table.
- ``saved_by``: the admin's owner id.
- ``document``: canonical JSON (:func:`jobs.store.dumps`) of every saved key → value; the latest row
  is the saved state, older rows are the history.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, CheckConstraint, Column, Integer, String, Table, Text

from . import models

#: The job layer's metadata (naming convention included).
metadata = models.metadata

runtime_settings = Table(
    "runtime_settings",
    metadata,
    Column("revision", Integer, primary_key=True, autoincrement=False),
    Column("saved_at", BigInteger, nullable=False),
    Column("saved_by", String(200), nullable=False),
    Column("document", Text, nullable=False),
    CheckConstraint("revision >= 1", name="revision_positive"),
)
