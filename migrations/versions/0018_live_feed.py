"""The live feed's promises: per-identity cursors, login sessions, connection slots shared by every web process.

- ``job_events.owner_id``: the job's owner, written with each event (a job's owner never changes), and
  ``ix_job_events_owner`` (``owner_id``, ``change_xid``, ``change_id``): one owner's events in change-feed
  order, so a user's feed reads only that user's events — resuming a quiet user's cursor never walks
  everyone else's. On SQLite the two change columns are NULL and the index's implicit ``rowid`` is the
  position; on PostgreSQL the position is ``(change_xid, change_id)`` (revision 0009). Existing events
  get their job's owner here.
- ``live_feeds``: one row per feed a subscriber opened (``jobs/feeds.py``). A feed's cursor is
  ``<id>.<n>``: its random id and the number of notices it has delivered; the row holds where the feed
  started in the job layer's change feed (``anchor``) and one recent ``(n, position)`` pair (``mark``)
  from which any cursor of the feed is found by counting its owner's events. Rows belong to
  ``subscriber`` (the identity that opened the feed) and see ``owner_id``'s jobs (NULL: all jobs).
- ``login_sessions``: one row per UI login (``accounts/sessions.py``): the SHA-256 of the session secret
  the signed cookie carries, and a digest of the password hash at login, so a logout or a password change
  ends the session on the server — for every later request and every open live stream.
- ``live_slots``: one row per open live-feed connection, on any web process of any host
  (``accounts/live_slots.py``): the per-identity connection limit counts these. The streaming loop
  renews ``expires_at``; a killed process stops renewing and its rows expire.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-12
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job_events", sa.Column("owner_id", sa.String(200), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute("UPDATE job_events e SET owner_id = j.owner_id FROM jobs j WHERE j.id = e.job_id")
    else:
        op.execute("UPDATE job_events SET owner_id = (SELECT j.owner_id FROM jobs j WHERE j.id = job_events.job_id)")
    op.create_index("ix_job_events_owner", "job_events", ["owner_id", "change_xid", "change_id"])

    op.create_table(
        "live_feeds",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("subscriber", sa.String(200), nullable=False),
        sa.Column("owner_id", sa.String(200), nullable=True),
        sa.Column("anchor_a", sa.BigInteger(), nullable=False),
        sa.Column("anchor_b", sa.BigInteger(), nullable=False),
        sa.Column("mark_seq", sa.BigInteger(), nullable=False),
        sa.Column("mark_a", sa.BigInteger(), nullable=False),
        sa.Column("mark_b", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_live_feeds"),
        sa.CheckConstraint("mark_seq >= 0", name="ck_live_feeds_mark_seq_positive"),
    )
    op.create_index("ix_live_feeds_subscriber_updated_at", "live_feeds", ["subscriber", "updated_at"])

    op.create_table(
        "login_sessions",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("password_digest", sa.String(64), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_login_sessions"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_login_sessions_user_id_users", ondelete="CASCADE"),
    )
    op.create_index("ix_login_sessions_user_id_created_at", "login_sessions", ["user_id", "created_at"])

    op.create_table(
        "live_slots",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("identity", sa.String(200), nullable=False),
        sa.Column("holder", sa.String(300), nullable=False),
        sa.Column("acquired_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_live_slots"),
    )
    op.create_index("ix_live_slots_identity_expires_at", "live_slots", ["identity", "expires_at"])


def downgrade() -> None:
    op.drop_index("ix_live_slots_identity_expires_at", table_name="live_slots")
    op.drop_table("live_slots")
    op.drop_index("ix_login_sessions_user_id_created_at", table_name="login_sessions")
    op.drop_table("login_sessions")
    op.drop_index("ix_live_feeds_subscriber_updated_at", table_name="live_feeds")
    op.drop_table("live_feeds")
    op.drop_index("ix_job_events_owner", table_name="job_events")
    op.drop_column("job_events", "owner_id")
