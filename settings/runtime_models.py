"""The ``runtime_settings`` table: one row per saved batch of runtime settings (append-only history).

Revision ``0005_runtime_settings`` creates it; this declaration mirrors it (tests compare both).

- ``revision``: 1, 2, 3, … — the primary key, so two admins saving on the same revision cannot both
  insert ``revision + 1`` (the second gets a conflict, whatever the database).
- ``saved_at``: integer milliseconds since the epoch (UTC), as in every other table.
- ``saved_by``: the admin's owner id.
- ``document``: canonical JSON (sorted keys, no spaces) of every saved key → value; the latest row
  is the saved state, older rows are the history.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, CheckConstraint, Column, Integer, MetaData, String, Table, Text

#: The runtime settings table (revision ``0005_runtime_settings`` creates it), named as jobs/models.py names.
metadata = MetaData(naming_convention={"ck": "ck_%(table_name)s_%(constraint_name)s", "pk": "pk_%(table_name)s"})

runtime_settings = Table(
    "runtime_settings",
    metadata,
    Column("revision", Integer, primary_key=True, autoincrement=False),
    Column("saved_at", BigInteger, nullable=False),
    Column("saved_by", String(200), nullable=False),
    Column("document", Text, nullable=False),
    CheckConstraint("revision >= 1", name="revision_positive"),
)
