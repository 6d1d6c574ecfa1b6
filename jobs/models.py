"""SQLAlchemy models of the job tables (Alembic's ``migrations/`` creates them; tests compare both).

Timestamps are integer milliseconds since the epoch (UTC) in every table, as in the broker's, so
SQLite and PostgreSQL compare them the same way. JSON documents are stored as text written by
:func:`jobs.store.dumps` (canonical: sorted keys), which keeps request digests stable.

The CHECKs are the status machine of :mod:`jobs.status`:

- ``status`` is one of the six statuses;
- a terminal job (succeeded, failed, cancelled, interrupted) has ``completed_at``; no other has;
- a running job has ``worker_id`` and ``lease_expires_at``; no other job has either;
- a queued job has no cancel request (cancelling a queued job cancels it at once);
- ``0 <= attempt <= max_attempts``.

Revision 0009 adds what a model cannot declare: the ``jobs_status_moves`` trigger (only the moves of
``jobs.status.ALLOWED``; since revision 0013 it checks every write of ``status``) and the text-search
index (SQLite: the ``jobs_search`` FTS5 table; PostgreSQL: ``job_search`` with a trigram index), each
kept in step by triggers.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

STATUSES_SQL = "'queued', 'running', 'succeeded', 'failed', 'cancelled', 'interrupted'"
TERMINAL_SQL = "'succeeded', 'failed', 'cancelled', 'interrupted'"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Job(Base):
    """One unit of work a user submitted, across all its attempts."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(200))
    actor_name: Mapped[str] = mapped_column(String(200))
    queue_name: Mapped[str] = mapped_column(String(200))
    resource_type: Mapped[str | None] = mapped_column(String(100))
    resource_id: Mapped[str | None] = mapped_column(String(200))
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_digest: Mapped[str] = mapped_column(String(64))
    payload: Mapped[str] = mapped_column(Text)
    config: Mapped[str] = mapped_column(Text)
    priority: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer)
    max_attempts: Mapped[int] = mapped_column(Integer)
    timeout_s: Mapped[int] = mapped_column(Integer)
    safe_to_rerun: Mapped[bool] = mapped_column(Boolean)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[int | None] = mapped_column(BigInteger)
    run_after: Mapped[int] = mapped_column(BigInteger)
    progress: Mapped[float | None] = mapped_column(Float)
    progress_message: Mapped[str | None] = mapped_column(Text)
    result: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    cancel_requested_at: Mapped[int | None] = mapped_column(BigInteger)
    event_seq: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[int | None] = mapped_column(BigInteger)
    completed_at: Mapped[int | None] = mapped_column(BigInteger)
    retry_of_job_id: Mapped[str | None] = mapped_column(String(32), ForeignKey("jobs.id"))
    parent_job_id: Mapped[str | None] = mapped_column(String(32), ForeignKey("jobs.id"))
    #: The kind's short description of the job (its folder, its clip window): shown and searched, never the payload.
    summary: Mapped[str | None] = mapped_column(String(200))
    #: The W3C trace context of the submit's span (JSON), when tracing was on: recovery's messages carry it.
    trace_context: Mapped[str | None] = mapped_column(Text)
    #: The job's keys under its kind's concurrency and rate limits (``<limit>=<value>``; revision 0019).
    concurrency_key: Mapped[str | None] = mapped_column(String(200))
    rate_key: Mapped[str | None] = mapped_column(String(200))
    #: Why a queued job waits for admission (no message yet: ``queue``, ``concurrency``, ``rate``) and on
    #: what (the queue or the key); NULL for every other job (revision 0019, :mod:`jobs.admission`).
    held: Mapped[str | None] = mapped_column(String(16))
    held_on: Mapped[str | None] = mapped_column(String(200))

    __table_args__ = (
        CheckConstraint(f"status IN ({STATUSES_SQL})", name="status_known"),
        CheckConstraint(
            f"(status IN ({TERMINAL_SQL}) AND completed_at IS NOT NULL) "
            f"OR (status NOT IN ({TERMINAL_SQL}) AND completed_at IS NULL)",
            name="terminal_has_completed_at",
        ),
        CheckConstraint(
            "(status = 'running' AND worker_id IS NOT NULL AND lease_expires_at IS NOT NULL) "
            "OR (status <> 'running' AND worker_id IS NULL AND lease_expires_at IS NULL)",
            name="running_has_lease",
        ),
        CheckConstraint("status <> 'queued' OR cancel_requested_at IS NULL", name="queued_not_cancel_requested"),
        CheckConstraint("attempt >= 0 AND attempt <= max_attempts AND max_attempts >= 1", name="attempt_range"),
        CheckConstraint("timeout_s > 0", name="timeout_positive"),
        CheckConstraint("event_seq >= 0", name="event_seq_positive"),
        CheckConstraint(
            "held IS NULL OR (status = 'queued' AND held IN ('queue', 'concurrency', 'rate', 'steps') "
            "AND held_on IS NOT NULL)",
            name="held_waiting",
        ),
        # (PostgreSQL also has ix_jobs_owner_status_created, revision 0023: not declared here, SQLite lacks it.)
        Index("ix_jobs_owner_created", "owner_id", "created_at"),
        # Live jobs by status (lease recovery, the queued and running lists) and counts by status and kind
        # (bulk dry runs): kind never changes, so no transition writes more entries for it (revision 0020).
        Index("ix_jobs_status_kind", "status", "kind", "lease_expires_at"),
        Index("ix_jobs_resource", "resource_type", "resource_id"),
        Index("ix_jobs_parent", "parent_job_id"),
        Index("ix_jobs_retry_of", "retry_of_job_id"),
        # Every owner's jobs newest first (admin lists, bulk counts; revision 0008): all statuses, or one
        # terminal status (partial: a job enters it once, when it finishes; claims never touch it).
        Index("ix_jobs_created", "created_at", "id"),
        Index(
            "ix_jobs_finished_created",
            "status",
            "created_at",
            "id",
            sqlite_where=text("completed_at IS NOT NULL"),
            postgresql_where=text("completed_at IS NOT NULL"),
        ),
        # The activity chart's finished jobs by completion time, with the times it reads (revision 0016).
        Index(
            "ix_jobs_finished_times",
            "completed_at",
            "status",
            "created_at",
            "started_at",
            sqlite_where=text("completed_at IS NOT NULL"),
            postgresql_where=text("completed_at IS NOT NULL"),
        ),
        # Admission (revision 0019): admitted and running jobs per queue and owner, and per key. Partial:
        # finished jobs are in none of them. ``held`` (always NULL in them) makes SQLite read them alone,
        # without the table. (Held jobs' index, ix_jobs_held, follows the class.)
        Index(
            "ix_jobs_inflight",
            "queue_name",
            "owner_id",
            "status",
            "run_after",
            "held",
            sqlite_where=text("held IS NULL AND status IN ('queued', 'running')"),
            postgresql_where=text("held IS NULL AND status IN ('queued', 'running')"),
        ),
        Index(
            "ix_jobs_concurrency_active",
            "concurrency_key",
            "owner_id",
            "status",
            "run_after",
            "held",
            sqlite_where=text("concurrency_key IS NOT NULL AND held IS NULL AND status IN ('queued', 'running')"),
            postgresql_where=text("concurrency_key IS NOT NULL AND held IS NULL AND status IN ('queued', 'running')"),
        ),
        Index(
            "ix_jobs_rate_active",
            "rate_key",
            "owner_id",
            "status",
            "held",
            sqlite_where=text("rate_key IS NOT NULL AND held IS NULL AND status IN ('queued', 'running')"),
            postgresql_where=text("rate_key IS NOT NULL AND held IS NULL AND status IN ('queued', 'running')"),
        ),
        # Retention's candidates (revision 0007). Partial: only finished jobs are in it, so claims
        # and other transitions of live jobs never touch it; a job enters it once, when it finishes.
        Index(
            "ix_jobs_status_completed",
            "status",
            "completed_at",
            sqlite_where=text("completed_at IS NOT NULL"),
            postgresql_where=text("completed_at IS NOT NULL"),
        ),
    )


# Held jobs in the order admission takes them (revision 0019): per owner, highest priority first, then
# the oldest. Declared on the table so that ``priority`` can be descending.
Index(
    "ix_jobs_held",
    Job.held,
    Job.held_on,
    Job.owner_id,
    Job.priority.desc(),
    Job.run_after,
    Job.created_at,
    Job.id,
    sqlite_where=text("held IS NOT NULL"),
    postgresql_where=text("held IS NOT NULL"),
)


class JobEvent(Base):
    """What happened to a job, in order: ``sequence`` is per job, unique and gap-free."""

    __tablename__ = "job_events"

    job_id: Mapped[str] = mapped_column(String(32), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    sequence: Mapped[int] = mapped_column(Integer, primary_key=True)
    type: Mapped[str] = mapped_column(String(64))
    data: Mapped[str] = mapped_column(Text)
    created_at: Mapped[int] = mapped_column(BigInteger)
    #: PostgreSQL only (NULL on SQLite, whose change cursor is the rowid): the writing transaction's id
    #: (raised to the job's previous event's when that is larger, revision 0012) and a sequence value,
    #: the live feed's change cursor (revision 0009; see jobs.read_store.event_changes_after).
    change_xid: Mapped[int | None] = mapped_column(BigInteger)
    change_id: Mapped[int | None] = mapped_column(BigInteger)
    #: The job's owner, written with the event (revision 0018): one owner's change feed is an index range.
    owner_id: Mapped[str | None] = mapped_column(String(200))

    __table_args__ = (
        CheckConstraint("sequence >= 1", name="sequence_positive"),
        # One owner's events in change-feed order (SQLite: the change columns are NULL, the implicit rowid
        # is the position).
        Index("ix_job_events_owner", "owner_id", "change_xid", "change_id"),
    )


class Idempotency(Base):
    """An idempotency key, scoped by owner and kind, and the request it was first used for."""

    __tablename__ = "idempotency"

    owner_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(200), primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    request_digest: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(String(32), ForeignKey("jobs.id", ondelete="CASCADE"))
    created_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_idempotency_job", "job_id"),)


class Outbox(Base):
    """Messages written in a job's transaction, published by the relay after commit (non-SQLite brokers)."""

    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    message_id: Mapped[str] = mapped_column(String(64), unique=True)
    job_id: Mapped[str | None] = mapped_column(String(32), ForeignKey("jobs.id", ondelete="SET NULL"))
    queue_name: Mapped[str] = mapped_column(String(200))
    actor_name: Mapped[str] = mapped_column(String(200))
    body: Mapped[bytes] = mapped_column(LargeBinary)
    eta: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[int] = mapped_column(BigInteger)
    published_at: Mapped[int | None] = mapped_column(BigInteger)
    attempts: Mapped[int] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        Index("ix_outbox_pending", "published_at", "id"),
        # Deleting a job looks up its outbox rows (ON DELETE SET NULL; retention deletes published ones).
        Index("ix_outbox_job", "job_id"),
    )


class JobDependency(Base):
    """Workflow edges: ``job_id`` may start only after ``depends_on_job_id`` succeeded."""

    __tablename__ = "job_dependencies"

    job_id: Mapped[str] = mapped_column(String(32), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    depends_on_job_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )

    __table_args__ = (
        CheckConstraint("job_id <> depends_on_job_id", name="no_self_dependency"),
        Index("ix_job_dependencies_depends_on", "depends_on_job_id"),
    )


class JobExit(Base):
    """An attempt that timed out while its thread would not stop (revision 0014): the job is failed, the
    thread runs on. Its worker renews the lease while the thread lives and deletes the row when it
    returns; recovery ends a row whose lease expired. A manual retry waits while the lease is live."""

    __tablename__ = "job_exits"

    job_id: Mapped[str] = mapped_column(String(32), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[str] = mapped_column(String(200))
    timed_out_at: Mapped[int] = mapped_column(BigInteger)
    lease_expires_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_job_exits_lease", "lease_expires_at"),)


class RateStart(Base):
    """One start of a rate-limited job (revision 0019): a rate limit counts its key's rows of the last period."""

    __tablename__ = "rate_starts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(200))
    started_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_rate_starts_key_started_at", "key", "started_at"),)


class RetentionMark(Base):
    """A named high-water mark of retention (revision 0007).

    ``job_events.pruned_through``: the highest ``job_events`` rowid retention has deleted (SQLite).
    A live-feed cursor below it may have missed a deleted event (``jobs.queries.changes_after``).
    """

    __tablename__ = "retention_marks"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)


class LiveFeed(Base):
    """A feed a live-feed subscriber opened (``jobs/feeds.py``): its cursors are ``<id>.<n>``.

    ``anchor``: the change-feed position it started at; ``mark``: a position by which the feed had
    delivered exactly ``mark_seq`` notices (every event of ``owner_id`` — NULL: of everyone — in
    ``(anchor, mark]``). Positions are :mod:`jobs.read_store`'s: ``(rowid, 0)`` on SQLite,
    ``(change_xid, change_id)`` on PostgreSQL.
    """

    __tablename__ = "live_feeds"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    #: The identity that opened it; only that identity resumes it.
    subscriber: Mapped[str] = mapped_column(String(200))
    owner_id: Mapped[str | None] = mapped_column(String(200))
    anchor_a: Mapped[int] = mapped_column(BigInteger)
    anchor_b: Mapped[int] = mapped_column(BigInteger)
    mark_seq: Mapped[int] = mapped_column(BigInteger)
    mark_a: Mapped[int] = mapped_column(BigInteger)
    mark_b: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        CheckConstraint("mark_seq >= 0", name="mark_seq_positive"),
        Index("ix_live_feeds_subscriber_updated_at", "subscriber", "updated_at"),
    )


metadata = Base.metadata
