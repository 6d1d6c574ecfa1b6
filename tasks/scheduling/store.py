"""All schedule SQL.

Tables (created by the Alembic revision ``0003_schedules``; :data:`metadata` mirrors it):

- ``schedules``: one row per schedule name. ``anchor_ms`` is the instant before which nothing may
  fire (when the schedule first became known, or was last resumed): a scheduler that starts never
  fires a tick merely because it started. ``last_fire_ms`` is the nominal time of the latest
  *scheduled* fire and only ever grows: it is the fence every fire passes (``schedule_claim_tick``).
  ``next_fire_ms`` is the tick the schedulers will handle next, written by every scheduler wake that
  handled a tick (``schedule_plan_next``): it lies in the past once no scheduler handled the tick
  that came due (what ``TenureScheduleOverdue`` watches).
- ``schedule_fires``: one row per fire, ``PRIMARY KEY (schedule, fire_time)``; ``fire_time`` is the
  nominal tick (UTC epoch ms, before jitter). Manual "run now" fires use the request instant,
  nudged off whole seconds so it can never take a tick's key. Each row also says what else happened
  to its tick (revision ``0011``): ``duplicates`` counts the other attempts the fence refused, and
  ``skipped``/``skipped_from`` the scheduled ticks before it that never fired (dropped by the catch-up
  policy or the grace window after downtime).

Invariants the queries keep:
- a tick fires only inside the transaction that moves ``last_fire_ms`` forward past it, and that
  same transaction inserts its fire row and its message, so concurrent schedulers fire it once;
- a paused schedule (``paused = 1``, with ``paused_at``) passes no fence;
- pruning never deletes a schedule's latest fire row.

Times are epoch milliseconds (BIGINT), as in the broker. One function per query; callers pass the
connection so a fire, its fence and its message share one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    ForeignKeyConstraint,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.engine import Connection

FIRE_CAUSES = ("schedule", "catchup", "manual")
#: Skipped ticks counted per fire; a fire that skipped more records this plus one ("more than").
MAX_SKIPPED_COUNTED = 1000

metadata = MetaData()

schedules_table = Table(
    "schedules",
    metadata,
    Column("name", String(200), nullable=False),
    Column("paused", SmallInteger, nullable=False, server_default=text("0")),
    Column("paused_at", BigInteger),
    Column("paused_by", String(200)),
    Column("anchor_ms", BigInteger, nullable=False),
    Column("last_fire_ms", BigInteger),
    Column("spec", Text),
    Column("next_fire_ms", BigInteger),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("name", name="pk_schedules"),
    CheckConstraint("paused IN (0, 1)", name="ck_schedules_paused_flag"),
    CheckConstraint("(paused = 1) = (paused_at IS NOT NULL)", name="ck_schedules_paused_at"),
)

schedule_fires_table = Table(
    "schedule_fires",
    metadata,
    Column("schedule", String(200), nullable=False),
    Column("fire_time", BigInteger, nullable=False),
    Column("cause", String(16), nullable=False),
    Column("message_id", String(64)),
    Column("job_id", String(64)),
    Column("due_at", BigInteger, nullable=False),
    Column("fired_by", String(200), nullable=False),
    Column("fired_at", BigInteger, nullable=False),
    Column("duplicates", Integer, nullable=False, server_default=text("0")),
    Column("skipped", Integer, nullable=False, server_default=text("0")),
    Column("skipped_from", BigInteger),
    PrimaryKeyConstraint("schedule", "fire_time", name="pk_schedule_fires"),
    ForeignKeyConstraint(
        ["schedule"], ["schedules.name"], name="fk_schedule_fires_schedule_schedules", ondelete="CASCADE"
    ),
    CheckConstraint("cause IN ('schedule', 'catchup', 'manual')", name="ck_schedule_fires_cause"),
)


@dataclass(frozen=True)
class ScheduleState:
    """A ``schedules`` row."""

    name: str
    paused: bool
    paused_at: int | None
    paused_by: str | None
    anchor_ms: int
    last_fire_ms: int | None
    spec: str | None
    next_fire_ms: int | None
    created_at: int
    updated_at: int

    @property
    def lower_ms(self) -> int:
        """Nothing at or before this instant may fire (the later of anchor and last scheduled fire)."""
        return max(self.anchor_ms, self.last_fire_ms if self.last_fire_ms is not None else self.anchor_ms)


@dataclass(frozen=True)
class FireRecord:
    """A ``schedule_fires`` row.

    ``duplicates``: later attempts at this tick that the fence refused (another scheduler had fired it).
    ``skipped``: scheduled ticks between the previous fence and this one that never fired (at most
    :data:`MAX_SKIPPED_COUNTED` + 1, meaning "more"); ``skipped_from``: the earliest of them.
    """

    schedule: str
    fire_time: int
    cause: str
    message_id: str | None
    job_id: str | None
    due_at: int
    fired_by: str
    fired_at: int
    duplicates: int = 0
    skipped: int = 0
    skipped_from: int | None = None

    @property
    def skipped_more(self) -> bool:
        """More ticks were skipped than were counted: at least :data:`MAX_SKIPPED_COUNTED` + 1."""
        return self.skipped > MAX_SKIPPED_COUNTED


_STATE_COLUMNS = (
    "name, paused, paused_at, paused_by, anchor_ms, last_fire_ms, spec, next_fire_ms, created_at, updated_at"
)
_FIRE_COLUMNS = (
    "schedule, fire_time, cause, message_id, job_id, due_at, fired_by, fired_at, duplicates, skipped, skipped_from"
)


def _state(row: object) -> ScheduleState:
    values = tuple(row)  # type: ignore[call-overload]
    return ScheduleState(values[0], bool(values[1]), *values[2:])


def schedule_ensure(conn: Connection, name: str, now_ms: int, spec: str | None = None) -> bool:
    """Create the row of *name* anchored at *now_ms* if missing. Returns whether it was created."""
    result = conn.execute(
        text(
            "INSERT INTO schedules (name, paused, anchor_ms, spec, created_at, updated_at) "
            "VALUES (:name, 0, :now, :spec, :now, :now) ON CONFLICT (name) DO NOTHING"
        ),
        {"name": name, "now": now_ms, "spec": spec},
    )
    return result.rowcount == 1


def schedule_get(conn: Connection, name: str) -> ScheduleState | None:
    row = conn.execute(text(f"SELECT {_STATE_COLUMNS} FROM schedules WHERE name = :name"), {"name": name}).first()
    return _state(row) if row is not None else None


def schedule_list(conn: Connection) -> list[ScheduleState]:
    rows = conn.execute(text(f"SELECT {_STATE_COLUMNS} FROM schedules ORDER BY name")).all()
    return [_state(r) for r in rows]


def schedule_lock(conn: Connection, name: str) -> ScheduleState | None:
    """Read *name*'s row for a fire decision in a write transaction (row-locked on PostgreSQL).

    SQLite's write transaction already holds the database's write lock; PostgreSQL takes the row's
    lock, so the fence read here is the one the claim that follows moves.
    """
    lock = " FOR UPDATE" if conn.dialect.name == "postgresql" else ""
    row = conn.execute(text(f"SELECT {_STATE_COLUMNS} FROM schedules WHERE name = :name{lock}"), {"name": name}).first()
    return _state(row) if row is not None else None


def schedule_claim_tick(conn: Connection, name: str, fire_time: int, now_ms: int) -> bool:
    """The fence: move ``last_fire_ms`` to *fire_time* if the schedule runs and has not fired it or later.

    Returns:
      True when this transaction owns the tick; False when it is paused, before the anchor, or
      already fired (by any process).
    """
    result = conn.execute(
        text(
            "UPDATE schedules SET last_fire_ms = :t, updated_at = :now "
            "WHERE name = :name AND paused = 0 AND anchor_ms < :t "
            "AND (last_fire_ms IS NULL OR last_fire_ms < :t)"
        ),
        {"name": name, "t": fire_time, "now": now_ms},
    )
    return result.rowcount == 1


def schedule_set_paused(conn: Connection, name: str, paused: bool, now_ms: int, by: str | None) -> bool:
    """Pause (or resume) *name*. A paused schedule has no next fire (nothing is planned, nothing is
    overdue); resuming re-anchors it: ticks missed while paused never fire.

    Returns:
      Whether the state changed.
    """
    if paused:
        sql = (
            "UPDATE schedules SET paused = 1, paused_at = :now, paused_by = :by, next_fire_ms = NULL, "
            "updated_at = :now WHERE name = :name AND paused = 0"
        )
    else:
        sql = (
            "UPDATE schedules SET paused = 0, paused_at = NULL, paused_by = NULL, anchor_ms = :now, "
            "updated_at = :now WHERE name = :name AND paused = 1"
        )
    return conn.execute(text(sql), {"name": name, "now": now_ms, "by": by}).rowcount == 1


def schedule_set_spec(conn: Connection, name: str, spec: str, now_ms: int) -> None:
    """Record the declaration's text (for the UI)."""
    conn.execute(
        text("UPDATE schedules SET spec = :spec, updated_at = :now WHERE name = :name"),
        {"name": name, "spec": spec, "now": now_ms},
    )


def schedule_plan_next(conn: Connection, name: str, next_fire_ms: int, now_ms: int) -> bool:
    """Record the tick a scheduler will handle next (never for a paused schedule).

    Returns:
      Whether the row changed (False when another scheduler already planned that tick, or it is paused).
    """
    result = conn.execute(
        text(
            "UPDATE schedules SET next_fire_ms = :next, updated_at = :now "
            "WHERE name = :name AND paused = 0 AND (next_fire_ms IS NULL OR next_fire_ms <> :next)"
        ),
        {"name": name, "next": next_fire_ms, "now": now_ms},
    )
    return result.rowcount == 1


def fire_insert(conn: Connection, fire: FireRecord) -> bool:
    """Insert a fire row; False when ``(schedule, fire_time)`` already exists."""
    result = conn.execute(
        text(
            f"INSERT INTO schedule_fires ({_FIRE_COLUMNS}) "
            "VALUES (:schedule, :fire_time, :cause, :message_id, :job_id, :due_at, :fired_by, :fired_at, "
            ":duplicates, :skipped, :skipped_from) "
            "ON CONFLICT (schedule, fire_time) DO NOTHING"
        ),
        {
            "schedule": fire.schedule,
            "fire_time": fire.fire_time,
            "cause": fire.cause,
            "message_id": fire.message_id,
            "job_id": fire.job_id,
            "due_at": fire.due_at,
            "fired_by": fire.fired_by,
            "fired_at": fire.fired_at,
            "duplicates": fire.duplicates,
            "skipped": fire.skipped,
            "skipped_from": fire.skipped_from,
        },
    )
    return result.rowcount == 1


def fire_note_duplicate(conn: Connection, name: str, fire_time: int) -> bool:
    """Count one refused attempt at a tick that was fired. Returns False when the tick has no fire row
    (the attempt was refused for another reason: paused, or before the anchor)."""
    result = conn.execute(
        text("UPDATE schedule_fires SET duplicates = duplicates + 1 WHERE schedule = :name AND fire_time = :t"),
        {"name": name, "t": fire_time},
    )
    return result.rowcount == 1


def fire_list(conn: Connection, name: str | None = None, limit: int = 100) -> list[FireRecord]:
    """Fires, newest first, of one schedule or all."""
    where = "WHERE schedule = :name " if name is not None else ""
    rows = conn.execute(
        text(f"SELECT {_FIRE_COLUMNS} FROM schedule_fires {where}ORDER BY fire_time DESC LIMIT :limit"),
        {"name": name, "limit": limit},
    ).all()
    return [FireRecord(*r) for r in rows]


def fire_list_recent(conn: Connection, per_schedule: int) -> list[FireRecord]:
    """The newest *per_schedule* fires of every schedule, by schedule then newest first."""
    rows = conn.execute(
        text(
            f"SELECT {_FIRE_COLUMNS} FROM (SELECT {_FIRE_COLUMNS}, ROW_NUMBER() OVER "
            "(PARTITION BY schedule ORDER BY fire_time DESC) AS n FROM schedule_fires) recent "
            "WHERE n <= :per ORDER BY schedule, fire_time DESC"
        ),
        {"per": per_schedule},
    ).all()
    return [FireRecord(*r) for r in rows]


def fire_prune(conn: Connection, before_ms: int) -> int:
    """Delete fires whose tick is older than *before_ms*, keeping each schedule's latest one."""
    result = conn.execute(
        text(
            "DELETE FROM schedule_fires WHERE fire_time < :before AND fire_time < "
            "(SELECT MAX(f.fire_time) FROM schedule_fires f WHERE f.schedule = schedule_fires.schedule)"
        ),
        {"before": before_ms},
    )
    return int(result.rowcount or 0)
