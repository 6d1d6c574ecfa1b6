"""Roles as sets of actions, tokens carrying a subset of them, and the audit log.

- ``roles`` and ``role_permissions``: the built-in viewer, user, operator and admin roles with their
  actions (a copy of ``accounts.permissions`` as it was at this revision: revisions import no code).
- ``users.role`` (was CHECK ``admin``/``user``) becomes a reference to ``roles.name``; every existing
  user keeps their role (``user`` → the user role, ``admin`` → the admin role).
- ``api_tokens.permissions``: the actions a token carries. An existing token gets every action of its
  user's role, so it keeps working exactly as before.
- ``audit_log`` (``accounts/audit_store.py``).

On SQLite the users table is rebuilt (a CHECK cannot be dropped in place). The rebuild drops the old
table, and with foreign keys on a DROP deletes the rows that reference it (``api_tokens``: ON DELETE
CASCADE) — so the tokens are set aside in a plain table first and put back after.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ALL = (
    "jobs.read_own",
    "jobs.read_all",
    "jobs.submit",
    "jobs.cancel",
    "jobs.retry",
    "jobs.bulk",
    "queues.pause",
    "dead_letters.manage",
    "schedules.manage",
    "settings.change",
    "users.manage",
    "tokens.manage_own",
    "metrics.read",
    "audit.read",
)
_USER = ("jobs.read_own", "jobs.submit", "jobs.cancel", "jobs.retry", "jobs.bulk", "tokens.manage_own")
_BUILTIN = {
    "viewer": (
        "reads every job and the operations pages; changes nothing",
        ("jobs.read_own", "jobs.read_all", "metrics.read", "tokens.manage_own"),
    ),
    "user": ("submits and manages their own jobs", _USER),
    "operator": (
        "runs queues, dead letters, schedules and everyone's jobs; no settings, no users",
        (*_USER, "jobs.read_all", "queues.pause", "dead_letters.manage", "schedules.manage", "metrics.read"),
    ),
    "admin": ("every action", _ALL),
}


def _id_column() -> sa.types.TypeEngine:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    bind = op.get_bind()
    roles = op.create_table(
        "roles",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("description", sa.String(200), server_default="", nullable=False),
        sa.Column("builtin", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_roles"),
        sa.UniqueConstraint("name", name="uq_roles_name"),
    )
    grants = op.create_table(
        "role_permissions",
        sa.Column("role_id", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("role_id", "action", name="pk_role_permissions"),
        sa.ForeignKeyConstraint(
            ["role_id"], ["roles.id"], name="fk_role_permissions_role_id_roles", ondelete="CASCADE"
        ),
    )
    now = int(time.time() * 1000)
    op.bulk_insert(
        roles,
        [
            {"id": i, "name": name, "description": text, "builtin": True, "created_at": now}
            for i, (name, (text, _)) in enumerate(_BUILTIN.items(), start=1)
        ],
    )
    op.bulk_insert(
        grants,
        [
            {"role_id": i, "action": action}
            for i, (_, (_, actions)) in enumerate(_BUILTIN.items(), start=1)
            for action in actions
        ],
    )
    if bind.dialect.name == "postgresql":
        # The ids above were given explicitly: move the sequence past them for roles defined later.
        op.execute("SELECT setval(pg_get_serial_sequence('roles', 'id'), (SELECT max(id) FROM roles))")

    sqlite = bind.dialect.name == "sqlite"
    if sqlite:
        op.execute("CREATE TABLE _tokens_0017 AS SELECT * FROM api_tokens")
        op.execute("DELETE FROM api_tokens")
    with op.batch_alter_table("users", recreate="auto") as batch:
        batch.drop_constraint(op.f("ck_users_role_known"), type_="check")
        batch.alter_column("role", type_=sa.String(64), existing_type=sa.String(16), existing_nullable=False)
        batch.create_foreign_key(op.f("fk_users_role_roles"), "roles", ["role"], ["name"])
        batch.create_index("ix_users_role", ["role"])
    op.add_column("api_tokens", sa.Column("permissions", sa.String(1000), server_default="", nullable=False))
    grants_of = {"admin": " ".join(sorted(_ALL)), "user": " ".join(sorted(_USER))}
    if sqlite:
        op.execute(
            "INSERT INTO api_tokens (id, user_id, name, prefix, token_hash, created_at, last_used_at, revoked_at) "
            "SELECT id, user_id, name, prefix, token_hash, created_at, last_used_at, revoked_at FROM _tokens_0017"
        )
        op.execute("DROP TABLE _tokens_0017")
    for role, actions in grants_of.items():
        op.execute(
            sa.text(
                "UPDATE api_tokens SET permissions = :actions "
                "WHERE user_id IN (SELECT id FROM users WHERE role = :role)"
            ).bindparams(actions=actions, role=role)
        )

    op.create_table(
        "audit_log",
        sa.Column("id", _id_column(), autoincrement=True, nullable=False),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("actor_id", sa.Integer(), nullable=True),
        sa.Column("actor_name", sa.String(64), nullable=True),
        sa.Column("via", sa.String(16), nullable=True),
        sa.Column("token_id", sa.Integer(), nullable=True),
        sa.Column("ip", sa.String(64), nullable=True),
        sa.Column("user_agent", sa.String(300), nullable=True),
        sa.Column("target_type", sa.String(32), nullable=True),
        sa.Column("target", sa.String(300), nullable=True),
        sa.Column("details", sa.Text(), nullable=True),
        sa.Column("reason", sa.String(500), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_audit_log"),
        sa.CheckConstraint("outcome IN ('ok', 'refused', 'failed')", name=op.f("ck_audit_log_outcome_known")),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_index("ix_audit_log_actor_name_id", "audit_log", ["actor_name", "id"])


def downgrade() -> None:
    op.drop_index("ix_audit_log_actor_name_id", table_name="audit_log")
    op.drop_index("ix_audit_log_at", table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_column("api_tokens", "permissions")
    # Users of a role the old CHECK does not know become plain users.
    op.execute("UPDATE users SET role = 'user' WHERE role NOT IN ('admin', 'user')")
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        op.execute("CREATE TABLE _tokens_0017 AS SELECT * FROM api_tokens")
        op.execute("DELETE FROM api_tokens")
    with op.batch_alter_table("users", recreate="auto") as batch:
        batch.drop_index("ix_users_role")
        batch.drop_constraint(op.f("fk_users_role_roles"), type_="foreignkey")
        batch.alter_column("role", type_=sa.String(16), existing_type=sa.String(64), existing_nullable=False)
        batch.create_check_constraint(op.f("ck_users_role_known"), "role IN ('admin', 'user')")
    if sqlite:
        op.execute("INSERT INTO api_tokens SELECT * FROM _tokens_0017")
        op.execute("DROP TABLE _tokens_0017")
    op.drop_table("role_permissions")
    op.drop_table("roles")
