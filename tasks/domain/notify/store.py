"""The breaker's SQL: table ``endpoint_health``, one row per notification endpoint.

Columns: ``endpoint`` (key), ``state`` (``closed`` | ``open`` | ``disabled``, CHECKed),
``consecutive_failures``, ``opened_at`` (set iff the state is ``open``, CHECKed), ``probe_until``
(the half-open probe's lease), ``last_error`` (already free of secrets), ``updated_at``. Times are
Unix seconds (REAL) from the breaker's clock.

Every method is one statement in its own transaction (plus an idempotent insert of the row), so
concurrent workers never lose an increment and at most one of them wins the probe claim. SQLAlchemy
Core keeps it portable to PostgreSQL; the job layer hands in its engine, and Alembic will own the
table (``endpoint_health`` below is the definition to migrate).
"""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    Engine,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    case,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from .breaker import BreakerState

metadata = MetaData()

endpoint_health = Table(
    "endpoint_health",
    metadata,
    Column("endpoint", String(512), primary_key=True),
    Column("state", String(16), nullable=False, server_default="closed"),
    Column("consecutive_failures", Integer, nullable=False, server_default="0"),
    Column("opened_at", Float),
    Column("probe_until", Float),
    Column("last_error", Text),
    Column("updated_at", Float, nullable=False),
    CheckConstraint("state IN ('closed', 'open', 'disabled')", name="endpoint_health_state"),
    CheckConstraint("(state = 'open') = (opened_at IS NOT NULL)", name="endpoint_health_opened_iff_open"),
    CheckConstraint("consecutive_failures >= 0", name="endpoint_health_failures"),
)

#: last_error is truncated to this many characters.
MAX_ERROR_CHARS = 500


class SQLBreakerStore:
    """:class:`~tasks.domain.notify.breaker.BreakerStore` on a SQLAlchemy engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def create_schema(self) -> None:
        """Create the table (tests and stand-alone use; in Tenure, Alembic migrations do this)."""
        metadata.create_all(self.engine)

    def endpoint_health_get(self, endpoint: str) -> BreakerState | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(endpoint_health).where(endpoint_health.c.endpoint == endpoint)).one_or_none()
        return _state(row) if row is not None else None

    def endpoint_health_record_failure(self, endpoint: str, now: float, threshold: int, error: str) -> BreakerState:
        t = endpoint_health
        opens = or_(t.c.state == "open", t.c.consecutive_failures + 1 >= threshold)
        with self.engine.begin() as conn:
            self._ensure(conn, endpoint, now)
            # Every SET expression reads the row's old values (standard SQL), so this is one atomic step.
            conn.execute(
                update(t)
                .where(and_(t.c.endpoint == endpoint, t.c.state != "disabled"))
                .values(
                    consecutive_failures=t.c.consecutive_failures + 1,
                    state=case((opens, "open"), else_="closed"),
                    opened_at=case((opens, now), else_=None),
                    probe_until=None,
                    last_error=error[:MAX_ERROR_CHARS],
                    updated_at=now,
                )
            )
            return _state(conn.execute(select(t).where(t.c.endpoint == endpoint)).one())

    def endpoint_health_record_success(self, endpoint: str, now: float) -> BreakerState:
        t = endpoint_health
        with self.engine.begin() as conn:
            self._ensure(conn, endpoint, now)
            conn.execute(
                update(t)
                .where(and_(t.c.endpoint == endpoint, t.c.state != "disabled"))
                .values(state="closed", consecutive_failures=0, opened_at=None, probe_until=None, updated_at=now)
            )
            return _state(conn.execute(select(t).where(t.c.endpoint == endpoint)).one())

    def endpoint_health_claim_probe(self, endpoint: str, now: float, reset_timeout_s: float, lease_s: float) -> bool:
        t = endpoint_health
        with self.engine.begin() as conn:
            result = conn.execute(
                update(t)
                .where(
                    and_(
                        t.c.endpoint == endpoint,
                        t.c.state == "open",
                        t.c.opened_at <= now - reset_timeout_s,
                        or_(t.c.probe_until.is_(None), t.c.probe_until <= now),
                    )
                )
                .values(probe_until=now + lease_s, updated_at=now)
            )
            return result.rowcount == 1

    def endpoint_health_set_disabled(self, endpoint: str, now: float, disabled: bool, reason: str) -> None:
        t = endpoint_health
        with self.engine.begin() as conn:
            self._ensure(conn, endpoint, now)
            conn.execute(
                update(t)
                .where(t.c.endpoint == endpoint)
                .values(
                    state="disabled" if disabled else "closed",
                    consecutive_failures=0,
                    opened_at=None,
                    probe_until=None,
                    last_error=reason[:MAX_ERROR_CHARS],
                    updated_at=now,
                )
            )

    def _ensure(self, conn, endpoint: str, now: float) -> None:
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        stmt = dialect.insert(endpoint_health).values(endpoint=endpoint, state="closed", updated_at=now)
        conn.execute(stmt.on_conflict_do_nothing(index_elements=["endpoint"]))


def _state(row) -> BreakerState:
    return BreakerState(
        endpoint=row.endpoint,
        state=row.state,
        consecutive_failures=row.consecutive_failures,
        opened_at=row.opened_at,
        probe_until=row.probe_until,
        last_error=row.last_error,
    )
