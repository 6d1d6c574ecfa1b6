"""SQLAlchemy model of monitoring's own table (migration ``0010``; the migration test compares both).

- ``worker_slots``: one row per slot of every live supervisor (``tenure worker``, ``tenure scheduler``,
  ``tenure relay``): the child process it runs now, how often it was restarted, its crash streak and
  whether it was given up. Written by the supervisor (:mod:`tenure_cli.slot_report`) in the job
  database, so the Workers page of any web process sees every host's supervisors. A supervisor
  rewrites its rows on every change and every ``heartbeat`` (10 s), deletes them when it stops; rows
  whose heartbeat is older than :data:`monitoring.store.WORKER_SLOT_STALE_MS` belong to a supervisor
  that was killed, are not shown, and the next supervisor that starts deletes them.

Times are integer milliseconds since the epoch (UTC), as in the job tables. The CHECKs are the slot's
states: ``running`` has a pid; ``restarting`` has no pid and a restart time; ``given_up`` (not
restarted any more) and ``stopped`` (its child exited during the supervisor's stop) have neither.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, CheckConstraint, Index, Integer, MetaData, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from jobs.models import NAMING_CONVENTION


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class WorkerSlot(Base):
    """One slot of a supervisor: the child process it keeps running, and its crashes."""

    __tablename__ = "worker_slots"

    #: ``host:pid:random`` of the supervisor process (one id per supervisor start).
    supervisor: Mapped[str] = mapped_column(String(200), primary_key=True)
    slot: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    supervisor_pid: Mapped[int] = mapped_column(Integer)
    #: The supervisor's ``--role`` (worker, asr, scheduler, relay, …).
    role: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    pid: Mapped[int | None] = mapped_column(Integer)
    #: Replacement processes started in this slot since the supervisor started.
    restarts: Mapped[int] = mapped_column(Integer)
    #: Consecutive crashes (reset by a process that outlived the crash window).
    crashes: Mapped[int] = mapped_column(Integer)
    #: How the last child ended: ``killed by SIGKILL``, ``exited with code 1``.
    last_exit: Mapped[str | None] = mapped_column(String(100))
    last_exit_at: Mapped[int | None] = mapped_column(BigInteger)
    restart_at: Mapped[int | None] = mapped_column(BigInteger)
    started_at: Mapped[int] = mapped_column(BigInteger)
    heartbeat_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        CheckConstraint("state IN ('running', 'restarting', 'given_up', 'stopped')", name="state"),
        CheckConstraint("(state = 'running') = (pid IS NOT NULL)", name="pid_iff_running"),
        CheckConstraint("(state = 'restarting') = (restart_at IS NOT NULL)", name="restart_at_iff_restarting"),
        CheckConstraint("restarts >= 0 AND crashes >= 0", name="counts"),
        Index("ix_worker_slots_heartbeat", "heartbeat_at"),
    )


metadata = Base.metadata
